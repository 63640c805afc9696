package ordering

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/outbox"
)

func rec(id uint64, payload int) *outbox.Record {
	return &outbox.Record{ID: id, Payload: make([]byte, payload), CreatedAt: time.Unix(int64(id), 0)}
}

func add(t *testing.T, tr *Tracker[int], id uint64) *Ticket[int] {
	t.Helper()
	tk, err := tr.Add(context.Background(), rec(id, 10))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// The watermark never passes a transaction with an unresolved message, even
// when later transactions are fully resolved.
func TestWatermarkIsPrefixOfResolvedTransactions(t *testing.T) {
	tr := New[int](1 << 20)
	a1, a2 := add(t, tr, 1), add(t, tr, 2)
	tr.Commit(10)
	b1 := add(t, tr, 3)
	tr.Commit(20)
	tr.Commit(30) // foreign

	if _, ok := tr.Take(); ok {
		t.Fatal("nothing is resolved, yet Take returned a batch")
	}
	tr.Done(b1, true, "")
	tr.Done(a2, false, "returned: NO_ROUTE")
	if _, ok := tr.Take(); ok {
		t.Fatal("transaction 10 still has an unresolved message, yet Take returned a batch")
	}
	tr.Done(a1, true, "")
	<-tr.Changed()
	b, ok := tr.Take()
	if !ok || b.Pos != 30 || b.Txns != 3 {
		t.Fatalf("Take = %+v, %v; want position 30 over 3 transactions", b, ok)
	}
	if got := b.Rows(); got != 3 {
		t.Fatalf("rows = %d, want 3", got)
	}
	if len(b.IDs) != 1 || b.IDs[0] != (Range{1, 3}) {
		t.Fatalf("ids = %v, want one range 1-3", b.IDs)
	}
	if len(b.Failed) != 1 || b.Failed[0].Record.ID != 2 || b.Failed[0].Reason != "returned: NO_ROUTE" {
		t.Fatalf("failed = %+v, want row 2 with its reason", b.Failed)
	}
	if !b.LastEventAt.Equal(time.Unix(3, 0)) {
		t.Fatalf("last event at %v, want created_at of row 3", b.LastEventAt)
	}
	if m, by := tr.Inflight(); m != 0 || by != 0 {
		t.Fatalf("in flight %d messages %d bytes after all outcomes", m, by)
	}
}

// A long run of foreign transactions folds into one entry.
func TestForeignTransactionsFold(t *testing.T) {
	tr := New[int](1 << 20)
	for i := 1; i <= 1000; i++ {
		tr.Commit(i)
	}
	if len(tr.queue) != 1 {
		t.Fatalf("queue holds %d entries for 1000 foreign transactions, want 1", len(tr.queue))
	}
	b, ok := tr.Take()
	if !ok || b.Pos != 1000 || b.Rows() != 0 {
		t.Fatalf("Take = %+v, %v; want position 1000 and no rows", b, ok)
	}
}

// Add blocks once the byte budget is spent and resumes when an outcome frees it.
func TestByteBudgetBlocksReader(t *testing.T) {
	one := int64(rec(1, 1000).Size())
	tr := New[int](2 * one)
	t1, err := tr.Add(context.Background(), rec(1, 1000))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Add(context.Background(), rec(2, 1000)); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := tr.Add(ctx, rec(3, 1000)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Add over budget returned %v, want it to block until the context ends", err)
	}

	got := make(chan error, 1)
	go func() {
		_, err := tr.Add(context.Background(), rec(3, 1000))
		got <- err
	}()
	tr.Done(t1, true, "")
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// A single row larger than the whole budget still passes, alone.
func TestOversizedRowPassesAlone(t *testing.T) {
	tr := New[int](100)
	tk, err := tr.Add(context.Background(), rec(1, 10_000))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := tr.Add(ctx, rec(2, 1)); err == nil {
		t.Fatal("a second row was admitted beside an oversized one")
	}
	tr.Done(tk, true, "")
	if err := tr.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestRangesCompactConsecutiveIDs(t *testing.T) {
	var rs []Range
	for _, id := range []uint64{5, 6, 7, 9, 10, 20} {
		rs = addID(rs, id)
	}
	want := []Range{{5, 7}, {9, 10}, {20, 20}}
	if len(rs) != len(want) {
		t.Fatalf("ranges %v, want %v", rs, want)
	}
	for i := range want {
		if rs[i] != want[i] {
			t.Fatalf("ranges %v, want %v", rs, want)
		}
	}
	if Count(rs) != 6 {
		t.Fatalf("count %d, want 6", Count(rs))
	}
}

func TestLanesKeepPartitionTogetherAndSpreadEmptyKeys(t *testing.T) {
	l := NewLanes(8)
	for _, k := range []string{"order-1", "注文-ü", "x"} {
		first := l.For(k)
		for i := 0; i < 10; i++ {
			if l.For(k) != first {
				t.Fatalf("partition %q moved lanes", k)
			}
		}
	}
	seen := map[int]bool{}
	for i := 0; i < 16; i++ {
		seen[l.For("")] = true
	}
	if len(seen) != 8 {
		t.Fatalf("empty keys used %d of 8 lanes", len(seen))
	}
}
