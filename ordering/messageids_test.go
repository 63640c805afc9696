package ordering

import (
	"context"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/outbox"
)

func recMID(t *testing.T, tr *Tracker[int], id uint64) *Ticket[int] {
	t.Helper()
	r := rec(id, 10)
	r.MessageID[0], r.MessageID[15] = 0xa0, byte(id) // distinct from the id's bytes
	tk, err := tr.Add(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func midOf(id uint64) outbox.MessageID {
	var m outbox.MessageID
	m[0], m[15] = 0xa0, byte(id)
	return m
}

// A batch carries each row's message id in the order of its id ranges,
// whatever order the outcomes came in, also across Merge.
func TestBatchCarriesMessageIDs(t *testing.T) {
	tr := New[int](1 << 20)
	a5, a6 := recMID(t, tr, 5), recMID(t, tr, 6)
	tr.Commit(10)
	tr.Commit(15) // foreign
	b9 := recMID(t, tr, 9)
	tr.Commit(20)
	tr.Done(b9, true, "")
	tr.Done(a6, false, "returned: NO_ROUTE")
	tr.Done(a5, true, "")
	b, ok := tr.Take()
	if !ok {
		t.Fatal("nothing to take")
	}
	if want := []Range{{5, 6}, {9, 9}}; !slices.Equal(b.IDs, want) {
		t.Fatalf("ids %v, want %v", b.IDs, want)
	}
	if want := []outbox.MessageID{midOf(5), midOf(6), midOf(9)}; !slices.Equal(b.MessageIDs, want) {
		t.Fatalf("message ids %v, want %v", b.MessageIDs, want)
	}
	if !b.HasPos || b.Pos != 20 || b.Txns != 3 {
		t.Fatalf("position %v (has %v) after %d transactions, want 20 after 3", b.Pos, b.HasPos, b.Txns)
	}

	c3 := recMID(t, tr, 3) // a lower id later: Merge keeps ids and message ids paired
	tr.Commit(30)
	tr.Done(c3, true, "")
	later, _ := tr.Take()
	b.Merge(later)
	if want := []Range{{5, 6}, {9, 9}, {3, 3}}; !slices.Equal(b.IDs, want) {
		t.Fatalf("merged ids %v, want %v", b.IDs, want)
	}
	if want := []outbox.MessageID{midOf(5), midOf(6), midOf(9), midOf(3)}; !slices.Equal(b.MessageIDs, want) {
		t.Fatalf("merged message ids %v, want %v", b.MessageIDs, want)
	}
	if b.Pos != 30 || b.Txns != 4 {
		t.Fatalf("merged position %v after %d transactions, want 30 after 4", b.Pos, b.Txns)
	}
}
