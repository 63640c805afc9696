package leadership_test

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// A clean Release leaves no leader in the row (leader_instance NULL), with
// the epoch unchanged and leader_since and leader_heartbeat kept as
// history; ReadStatus then shows no leader.
func TestReleaseClearsLeaderInstance(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	el := newElector(t, db, leadership.Config{Instance: "host-a:1"})
	store, err := checkpoint.New(db, checkpoint.Config{})
	if err != nil {
		t.Fatal(err)
	}
	leader, err := el.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := operator.ReadStatus(ctx, db, "default", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Leader == nil || rows[0].Leader.Instance != "host-a:1" || !rows[0].Leader.Alive {
		t.Fatalf("while leading: %+v", rows)
	}
	if err := leader.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.LeaderInstance != "" || p.Epoch != leader.Epoch() || p.LeaderSince.IsZero() || p.LeaderHeartbeat.IsZero() {
		t.Fatalf("after release: leader %q epoch %d (was %d) since %v heartbeat %v", p.LeaderInstance, p.Epoch, leader.Epoch(), p.LeaderSince, p.LeaderHeartbeat)
	}
	rows, err = operator.ReadStatus(ctx, db, "default", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Leader != nil {
		t.Fatalf("after release: %+v", rows)
	}
}
