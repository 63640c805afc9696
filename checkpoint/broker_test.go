package checkpoint_test

import (
	"errors"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// SetBroker writes the node and a stall (since now minus its length, by the
// server's clock) that ReadStatus reads back, clears them, and refuses a
// write of an epoch that no longer holds the row.
func TestSetBroker(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	store, leader := leading(ctx, t, db)
	broker := func() *operator.BrokerState {
		t.Helper()
		rows, err := operator.ReadStatus(ctx, db, "default", 10*time.Second)
		if err != nil || len(rows) != 1 {
			t.Fatalf("read status: %v (%d rows)", err, len(rows))
		}
		return rows[0].Broker
	}
	if b := broker(); b != nil {
		t.Fatalf("a new leader's row names a broker: %+v", b)
	}
	if err := store.SetBroker(ctx, leader.Epoch(), "127.0.0.1:5673", 0); err != nil {
		t.Fatal(err)
	}
	if b := broker(); b == nil || b.Node != "127.0.0.1:5673" || b.Stalled != nil {
		t.Fatalf("after a connect: %+v", b)
	}
	if err := store.SetBroker(ctx, leader.Epoch(), "127.0.0.1:5673", 12*time.Second); err != nil {
		t.Fatal(err)
	}
	b := broker()
	if b == nil || b.Stalled == nil || b.Stalled.Seconds < 12 || b.Stalled.Seconds > 72 ||
		time.Since(b.Stalled.Since) < 11*time.Second {
		t.Fatalf("after a stall of 12 s: %+v (stalled %+v)", b, b.Stalled)
	}
	if err := store.SetBroker(ctx, leader.Epoch()-1, "", 0); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("an old epoch's write: %v, want ErrFenced", err)
	}
	if err := store.SetBroker(ctx, leader.Epoch(), "", 0); err != nil {
		t.Fatal(err)
	}
	if b := broker(); b != nil {
		t.Fatalf("after clearing: %+v", b)
	}
}
