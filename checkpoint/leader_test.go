package checkpoint_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// leaderDB is a migrated database and a pool on it that parses times, as the
// relay's does.
func leaderDB(ctx context.Context, t *testing.T) *sql.DB {
	t.Helper()
	db := testenv.MySQL(t)
	if _, err := migrations.Apply(ctx, db.SQL, migrations.Options{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	sep := "?"
	if strings.Contains(db.DSN, "?") {
		sep = "&"
	}
	pool, err := sql.Open("mysql", db.DSN+sep+"parseTime=true&loc=UTC&time_zone=%27%2B00%3A00%27")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return pool
}

// A leader whose lock connection ends stops leading at once, not at its
// next heartbeat: Lost is closed.
func TestLeaderNoticesLostLockConnectionAtOnce(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	// A heartbeat a minute apart: noticing the loss within the bounded
	// wait below can only come from watching the connection.
	store, err := checkpoint.New(db, checkpoint.Config{HeartbeatInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	leader, err := store.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Release(context.WithoutCancel(ctx))
	if !leader.Valid() {
		t.Fatal("a new leader is not valid")
	}
	var holder int64
	if err := db.QueryRowContext(ctx, "SELECT IS_USED_LOCK('outbox-relay:default')").Scan(&holder); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	mustExec(ctx, t, db, "KILL CONNECTION "+strconv.FormatInt(holder, 10))
	select {
	case <-leader.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("leadership still held 10 s after its lock connection was killed")
	}
	t.Logf("lost %v after the kill: %v", time.Since(killed).Round(time.Millisecond), leader.Err())
	if leader.Valid() {
		t.Error("a lost leader is still valid")
	}
}

// A leader that stopped (its lock connection open, the lock held, and a
// transaction of it holding the progress row, as an acknowledgement's fence
// does) is taken over once its heartbeat is older than the lease, not
// before: the new leader's epoch is one more, the stale lock connection
// and transaction are ended.
func TestAcquireTakesOverStaleLeader(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	cfg := checkpoint.Config{HeartbeatInterval: 200 * time.Millisecond, LeaderLease: 2 * time.Second, Instance: "new"}
	store, err := checkpoint.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Load(ctx); err != nil {
		t.Fatal(err)
	}
	// The stale leader: the lock on its own connection, its epoch and a
	// fresh heartbeat.
	stale, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()
	var got int
	if err := stale.QueryRowContext(ctx, "SELECT GET_LOCK('outbox-relay:default', 0)").Scan(&got); err != nil || got != 1 {
		t.Fatalf("take the lock: %d, %v", got, err)
	}
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET epoch = epoch + 1, leader_instance = 'stale',
		leader_heartbeat = NOW(6) WHERE relay_name = 'default'`)
	var staleEpoch int64
	if err := db.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress").Scan(&staleEpoch); err != nil {
		t.Fatal(err)
	}
	_, err = store.Acquire(ctx)
	var held *checkpoint.HeldError
	if !errors.As(err, &held) || held.Leader != "stale" {
		t.Fatalf("Acquire with a fresh leader: %v, want a HeldError naming it", err)
	}

	// Its heartbeat ages past the lease; it is stopped inside a fence.
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET leader_heartbeat = NOW(6) - INTERVAL 3 SECOND`)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SELECT epoch FROM outbox_relay_progress FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 20*time.Second) // far below innodb_lock_wait_timeout
	leader, err := store.Acquire(actx)
	cancel()
	if err != nil {
		t.Fatalf("take over a stale leader: %v", err)
	}
	defer leader.Release(context.WithoutCancel(ctx))
	if leader.Epoch() != staleEpoch+1 || !strings.Contains(leader.TookOver(), "stale") {
		t.Errorf("new leader: epoch %d (stale %d), took over %q", leader.Epoch(), staleEpoch, leader.TookOver())
	}
	if err := stale.PingContext(ctx); err == nil {
		t.Error("the stale leader's lock connection is still open")
	}
	if err := tx.Commit(); err == nil {
		t.Error("the stale leader's transaction committed after the takeover")
	}
	if !leader.Valid() {
		t.Error("the new leader is not valid")
	}
}

// A lease shorter than three heartbeats is refused: the leader would lose
// it between two heartbeats. Unset, it is 10 s, or 5 heartbeats if longer.
func TestConfigLeaderLease(t *testing.T) {
	bad := checkpoint.Config{HeartbeatInterval: time.Second, LeaderLease: 2 * time.Second}
	if err := bad.Validate(); err == nil {
		t.Error("a 2 s lease with a 1 s heartbeat was accepted")
	}
	for _, c := range []struct{ hb, want time.Duration }{{0, 10 * time.Second}, {time.Minute, 5 * time.Minute}} {
		cfg := checkpoint.Config{HeartbeatInterval: c.hb}
		if err := cfg.Validate(); err != nil || cfg.LeaderLease != c.want {
			t.Errorf("heartbeat %v: lease %v, %v; want %v", c.hb, cfg.LeaderLease, err, c.want)
		}
	}
}
