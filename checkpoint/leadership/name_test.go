package leadership_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// A relay name's lock is the server's: a relay of the same name for a second
// database of the server is refused with a NameTakenError naming the
// database whose relay leads, and that leader is left alone (before, the
// second relay found its own progress row without a heartbeat, took the
// holder for a hung leader of its own and killed its lock connection: the
// two relays ended each other's terms in turn).
func TestAcquireRefusesNameLedInAnotherDatabase(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	first, second := testenv.MySQL(t), testenv.MySQL(t)
	cfg := leadership.Config{RelayName: "twin", HeartbeatInterval: 200 * time.Millisecond, LeaderLease: time.Second}
	leader, err := newElector(t, pool(ctx, t, first), cfg).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Release(context.WithoutCancel(ctx))

	el := newElector(t, pool(ctx, t, second), cfg)
	for range 3 {
		_, err = el.Acquire(ctx)
		var taken *leadership.NameTakenError
		if !errors.As(err, &taken) || !errors.Is(err, leadership.ErrNameTaken) {
			t.Fatalf("Acquire in a second database: %v, want a NameTakenError", err)
		}
		if taken.Database != second.Name || taken.Other != first.Name ||
			!strings.Contains(err.Error(), first.Name) || !strings.Contains(err.Error(), "--relay-name") {
			t.Fatalf("refusal %q: want it to name the database %s that leads and the way out", err, first.Name)
		}
	}
	// Past more than a lease, the first still leads: its lock connection
	// was not touched and its heartbeats went on.
	select {
	case <-leader.Lost():
		t.Fatalf("the first database's leader lost leadership: %v", leader.Err())
	case <-time.After(2 * cfg.LeaderLease):
	}
	if !leader.Valid() {
		t.Fatal("the first database's leader is no longer valid")
	}
}
