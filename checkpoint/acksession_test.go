package checkpoint_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/ordering"
)

// A leader stopped inside an acknowledgement (SIGSTOP, a paused VM) keeps its
// transaction, and the rows it deleted locked, for as long as its connection
// lives. The next leader, which published those rows again, acknowledges
// them at once: the takeover ended the stopped leader's acknowledging
// connection (it holds a poll lock), whose transaction rolled back and can
// no longer commit. Before, the new leader's acknowledgement waited on those
// locks, failed after innodb_lock_wait_timeout and was retried for as long
// as the old process stayed stopped (found by the streams SIGSTOP test).
func TestTakeoverEndsAStoppedLeadersAcknowledgement(t *testing.T) {
	ctx := testenv.WorkContext(t)
	db := testenv.MySQL(t).Migrate(ctx, t).SQL
	if err := checkpoint.EnsureRow(ctx, db, "default"); err != nil {
		t.Fatal(err)
	}
	mustExec(ctx, t, db, "INSERT INTO outbox (message_id, routing_key, payload) "+
		"SELECT UNHEX(REPLACE(UUID(), '-', '')), 'rk', 'x' FROM seq_1_to_20")
	var lo, hi uint64
	if err := db.QueryRowContext(ctx, "SELECT MIN(id), MAX(id) FROM outbox").Scan(&lo, &hi); err != nil {
		t.Fatal(err)
	}
	rows := []ordering.Range{{Lo: lo, Hi: hi}}
	ack := checkpoint.Ack{IDs: rows, MessageIDs: messageIDsOf(ctx, t, db, rows)}

	// The leader about to stop: its lock, its epoch, a heartbeat past the
	// lease (it stopped heartbeating too).
	lockConn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lockConn.Close()
	var got int
	if err := lockConn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", checkpoint.LockName("default")).Scan(&got); err != nil || got != 1 {
		t.Fatalf("take the leader lock: %d, %v", got, err)
	}
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET epoch = epoch + 1, leader_instance = 'stopped',
		leader_heartbeat = NOW(6) - INTERVAL 3 SECOND WHERE relay_name = 'default'`)
	var oldEpoch int64
	if err := db.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = 'default'").Scan(&oldEpoch); err != nil {
		t.Fatal(err)
	}
	// Its acknowledgement, stopped once its rows are deleted.
	old, err := checkpoint.New(db, checkpoint.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stopped, wake := make(chan struct{}), make(chan struct{})
	checkpoint.PauseAcks(old, func() { close(stopped); <-wake })
	oldDone := make(chan error, 1)
	go func() { oldDone <- old.Ack(ctx, oldEpoch, ack) }()
	select {
	case <-stopped:
	case err := <-oldDone:
		t.Fatalf("the old leader's acknowledgement ended before its commit: %v", err)
	}
	woken := false
	defer func() {
		if !woken {
			close(wake)
		}
	}()

	el, err := leadership.New(db, leadership.Config{HeartbeatInterval: 200 * time.Millisecond, LeaderLease: 2 * time.Second, Instance: "new"})
	if err != nil {
		t.Fatal(err)
	}
	leader, err := el.Acquire(ctx)
	if err != nil {
		t.Fatalf("take over the stopped leader: %v", err)
	}
	defer leader.Release(context.WithoutCancel(ctx))

	store, err := checkpoint.New(db, checkpoint.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// Without the takeover ending the stopped acknowledgement, this one
	// waits on its row locks and fails after innodb_lock_wait_timeout.
	if err := store.Ack(ctx, leader.Epoch(), ack); err != nil {
		t.Fatalf("the new leader's acknowledgement of the rows the stopped one holds: %v", err)
	}
	close(wake)
	woken = true
	if err := <-oldDone; err == nil {
		t.Fatal("the stopped leader's acknowledgement committed after the takeover")
	}
	var left int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d rows left after the new leader's acknowledgement", left)
	}
}
