package ordering

import (
	"context"
	"errors"
	"math/rand/v2"
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
// when later transactions are fully resolved; their rows may be taken
// before it moves.
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
	early, ok := tr.Take()
	if !ok || early.HasPos {
		t.Fatalf("Take = %+v, %v; want rows 2 and 3 without a position: transaction 10 still has an unresolved message", early, ok)
	}
	if len(early.IDs) != 1 || early.IDs[0] != (Range{2, 3}) || len(early.Failed) != 1 || early.Failed[0].Record.ID != 2 {
		t.Fatalf("early batch ids %v failed %+v, want rows 2-3 with row 2 failed", early.IDs, early.Failed)
	}
	tr.Done(a1, true, "")
	<-tr.Changed()
	b, ok := tr.Take()
	if !ok || !b.HasPos || b.Pos != 30 || b.Txns != 3 {
		t.Fatalf("Take = %+v, %v; want position 30 over 3 transactions", b, ok)
	}
	if len(b.IDs) != 1 || b.IDs[0] != (Range{1, 1}) || len(b.Failed) != 0 {
		t.Fatalf("ids %v failed %+v, want row 1 alone", b.IDs, b.Failed)
	}
	early.Merge(b)
	if got := early.Rows(); got != 3 {
		t.Fatalf("rows = %d, want 3", got)
	}
	if len(early.Failed) != 1 || early.Failed[0].Record.ID != 2 || early.Failed[0].Reason != "returned: NO_ROUTE" {
		t.Fatalf("failed = %+v, want row 2 with its reason", early.Failed)
	}
	if !early.LastEventAt.Equal(time.Unix(3, 0)) {
		t.Fatalf("last event at %v, want created_at of row 3", early.LastEventAt)
	}
	if m, _ := tr.Inflight(); m != 0 {
		t.Fatalf("in flight %d messages after all outcomes", m)
	}
	tr.Release(early.Bytes)
	if _, by := tr.Inflight(); by != 0 {
		t.Fatalf("%d bytes still charged after every row was acknowledged", by)
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

// Add blocks once the byte budget is spent; a confirm frees nothing, the
// acknowledgement (Release) does.
func TestByteBudgetBlocksReaderUntilAcknowledged(t *testing.T) {
	one := int64(rec(1, 1000).Size())
	tr := New[int](2 * one)
	t1, err := tr.Add(context.Background(), rec(1, 1000))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Add(context.Background(), rec(2, 1000)); err != nil {
		t.Fatal(err)
	}
	blocked := func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := tr.Add(ctx, rec(3, 1000)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Add over budget %s returned %v, want it to block until the context ends", what, err)
		}
	}
	blocked("with two rows in flight")
	tr.Done(t1, true, "")
	if _, by := tr.Inflight(); by != 2*one {
		t.Fatalf("%d bytes charged after one confirm, want %d: a row is charged until acknowledged", by, 2*one)
	}
	blocked("with a confirmed row not yet acknowledged")
	got := make(chan error, 1)
	go func() {
		_, err := tr.Add(context.Background(), rec(3, 1000))
		got <- err
	}()
	b, ok := tr.Take()
	if !ok || b.Bytes != one {
		t.Fatalf("Take = %+v, %v; want row 1 holding %d bytes", b, ok, one)
	}
	tr.Release(b.Bytes)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// A failed row keeps its whole size charged (its payload goes to
// outbox_failed) until acknowledged.
func TestFailedRowKeepsItsChargeUntilAcknowledged(t *testing.T) {
	tr := New[int](1 << 20)
	tk := add(t, tr, 1)
	size := int64(rec(1, 10).Size())
	tr.Done(tk, false, "nacked")
	if _, by := tr.Inflight(); by != size+int64(len("nacked")) {
		t.Fatalf("%d bytes charged for a failed row, want its size %d plus its reason", by, size)
	}
	b, _ := tr.Take()
	if len(b.Failed) != 1 || b.Failed[0].Record == nil || len(b.Failed[0].Record.Payload) != 10 {
		t.Fatalf("failed rows %+v, want row 1 with its payload", b.Failed)
	}
	tr.Release(b.Bytes)
	if _, by := tr.Inflight(); by != 0 {
		t.Fatalf("%d bytes charged after the acknowledgement", by)
	}
}

// A transaction larger than the whole budget passes: its rows are handed
// out for acknowledgement while it is still being read, and releasing them
// lets the reader go on. The position moves only once it has ended.
func TestTransactionLargerThanBudgetPasses(t *testing.T) {
	one := int64(rec(1, 100).Size())
	tr := New[int](10 * one)
	tickets := make(chan *Ticket[int], 100)
	done := make(chan struct{})
	go func() { // the broker: confirms in order
		for tk := range tickets {
			tr.Done(tk, true, "")
		}
	}()
	go func() { // the acker
		defer close(done)
		acked := 0
		for {
			select {
			case <-tr.Changed():
			case <-time.After(10 * time.Millisecond):
			}
			b, ok := tr.Take()
			if !ok {
				continue
			}
			if b.HasPos && b.Pos != 1 {
				t.Errorf("position %d, want 1", b.Pos)
			}
			acked += b.Rows()
			tr.Release(b.Bytes)
			if b.HasPos {
				if acked != 1000 {
					t.Errorf("the position moved with %d of 1000 rows acknowledged", acked)
				}
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for id := uint64(1); id <= 1000; id++ {
		tk, err := tr.Add(ctx, rec(id, 100))
		if err != nil {
			t.Fatalf("row %d of a transaction 100 times the budget: %v", id, err)
		}
		if _, by := tr.Inflight(); by > 10*one {
			t.Fatalf("%d bytes charged, budget %d", by, 10*one)
		}
		tickets <- tk
	}
	close(tickets)
	tr.Commit(1)
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the transaction's position was never handed out")
	}
}

// A row abandoned (never handed to a lane) is not acknowledged.
func TestAbandonedRowIsNotAcknowledged(t *testing.T) {
	tr := New[int](1 << 20)
	a, b := add(t, tr, 1), add(t, tr, 2)
	tr.Done(a, true, "")
	tr.Abandon(b)
	if m, by := tr.Inflight(); m != 0 || by != int64(rec(1, 10).Size()) {
		t.Fatalf("in flight %d messages %d bytes, want 0 and row 1's %d", m, by, rec(1, 10).Size())
	}
	got, _ := tr.Take()
	if got.HasPos || len(got.IDs) != 1 || got.IDs[0] != (Range{1, 1}) || len(got.Failed) != 0 {
		t.Fatalf("Take = %+v; want row 1 alone, no position", got)
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

// Outcomes come in any order across keys: a Channel delivers the Result
// of a message of one key while an earlier message of another key waits
// for its retry. Resolved in a shuffled order, the position handed out
// after each outcome is always the end of the longest prefix of
// transactions whose every row has an outcome, never past one with a row
// still waiting; every row is handed out once, as soon as it has its
// outcome, and its bytes are released then.
func TestWatermarkWithOutcomesOutOfOrder(t *testing.T) {
	const txns = 200
	rng := rand.New(rand.NewPCG(31, 3))
	tr := New[int](1 << 30)
	type row struct {
		tk  *Ticket[int]
		txn int
	}
	var rows []row
	id := uint64(0)
	for i := range txns {
		for range 1 + rng.IntN(4) {
			id++
			rows = append(rows, row{add(t, tr, id), i})
		}
		tr.Commit(i)
	}
	pending := make([]int, txns) // rows without an outcome, per transaction
	for _, r := range rows {
		pending[r.txn]++
	}
	rng.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	acked := map[uint64]bool{}
	prefix := 0 // transactions before it all have every outcome
	for n, r := range rows {
		rid := r.tk.Record().ID
		tr.Done(r.tk, true, "")
		pending[r.txn]--
		wantPos := prefix
		for prefix < txns && pending[prefix] == 0 {
			prefix++
		}
		b, ok := tr.Take()
		if !ok {
			t.Fatalf("outcome %d (row %d): nothing to take", n, rid)
		}
		if prefix > wantPos {
			if !b.HasPos || b.Pos != prefix-1 {
				t.Fatalf("outcome %d (row %d): position %v (set %v), want %d: the longest resolved prefix", n, rid, b.Pos, b.HasPos, prefix-1)
			}
		} else if b.HasPos {
			t.Fatalf("outcome %d (row %d): position %d handed out, but transaction %d still has a row without an outcome", n, rid, b.Pos, prefix)
		}
		if b.Rows() != 1 || b.IDs[0].Lo != rid || acked[rid] {
			t.Fatalf("outcome %d: rows %v, want row %d alone, once", n, b.IDs, rid)
		}
		acked[rid] = true
		tr.Release(b.Bytes)
	}
	if m, by := tr.Inflight(); m != 0 || by != 0 || len(acked) != len(rows) {
		t.Fatalf("after every outcome: %d in flight, %d bytes charged, %d of %d rows acknowledged", m, by, len(acked), len(rows))
	}
}
