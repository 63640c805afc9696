package leadership_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/internal/mysqlconn"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func mustExec(ctx context.Context, t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.ExecContext(ctx, q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// leaderDB is a migrated database and a pool on it that parses times, as the
// relay's does.
func leaderDB(ctx context.Context, t *testing.T) *sql.DB {
	t.Helper()
	return pool(ctx, t, testenv.MySQL(t))
}

// pool migrates db and opens a pool on it that parses times.
func pool(ctx context.Context, t *testing.T, db *testenv.DB) *sql.DB {
	t.Helper()
	return db.Migrate(ctx, t).Pool(t, mysqlconn.UTC)
}

// A leader whose lock connection ends stops leading at once, not at its
// next heartbeat: Lost is closed.
func TestLeaderNoticesLostLockConnectionAtOnce(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	// A heartbeat a minute apart: noticing the loss within the bounded
	// wait below can only come from watching the connection.
	el := newElector(t, db, leadership.Config{HeartbeatInterval: time.Minute})
	leader, err := el.Acquire(ctx)
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
	cfg := leadership.Config{HeartbeatInterval: 200 * time.Millisecond, LeaderLease: 2 * time.Second, Instance: "new"}
	el := newElector(t, db, cfg)
	if err := checkpoint.EnsureRow(ctx, db, "default"); err != nil {
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
	_, err = el.Acquire(ctx)
	var held *leadership.HeldError
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
	leader, err := el.Acquire(actx)
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
	bad := leadership.Config{HeartbeatInterval: time.Second, LeaderLease: 2 * time.Second}
	if err := bad.Validate(); err == nil {
		t.Error("a 2 s lease with a 1 s heartbeat was accepted")
	}
	for _, c := range []struct{ hb, want time.Duration }{{0, 10 * time.Second}, {time.Minute, 5 * time.Minute}} {
		cfg := leadership.Config{HeartbeatInterval: c.hb}
		cfg.SetDefaults()
		if err := cfg.Validate(); err != nil || cfg.LeaderLease != c.want {
			t.Errorf("heartbeat %v: lease %v, %v; want %v", c.hb, cfg.LeaderLease, err, c.want)
		}
	}
}

// freeLockOf makes the progress row look like a leader whose lock
// connection alone has ended (a proxy's idle timeout, a KILL) while its
// heartbeat is fresh: the lock is free, leader_instance names it. It returns
// its epoch and its stored heartbeat as the server's text.
func freeLockOf(ctx context.Context, t *testing.T, db *sql.DB, instance string) (int64, string) {
	t.Helper()
	if err := checkpoint.EnsureRow(ctx, db, "default"); err != nil {
		t.Fatal(err)
	}
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET epoch = epoch + 1, leader_instance = '`+instance+`',
		leader_heartbeat = NOW(6) WHERE relay_name = 'default'`)
	var (
		epoch int64
		hb    string
	)
	if err := db.QueryRowContext(ctx, "SELECT epoch, CAST(leader_heartbeat AS CHAR) FROM outbox_relay_progress").Scan(&epoch, &hb); err != nil {
		t.Fatal(err)
	}
	return epoch, hb
}

// sinceHeartbeat is how long ago, by the server's clock, hb (as stored) was.
func sinceHeartbeat(ctx context.Context, t *testing.T, db *sql.DB, hb string) time.Duration {
	t.Helper()
	var us int64
	if err := db.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, ?, NOW(6))", hb).Scan(&us); err != nil {
		t.Fatal(err)
	}
	return time.Duration(us) * time.Microsecond
}

// waitEpoch waits until the progress row is at epoch want.
func waitEpoch(ctx context.Context, t *testing.T, db *sql.DB, want int64) {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	for {
		var epoch int64
		if err := db.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress").Scan(&epoch); err != nil {
			t.Fatal(err)
		}
		if epoch == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("progress row at epoch %d, want %d: %v", epoch, want, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

type acquired struct {
	leader *leadership.Leader
	err    error
}

func acquireAsync(ctx context.Context, el *leadership.Elector) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := el.Acquire(ctx)
		ch <- acquired{l, err}
	}()
	return ch
}

// A leader whose lock is free while its stored heartbeat is younger than
// the lease (it may be stopped, and publish when it wakes) is taken over,
// but Acquire returns only once that heartbeat is a lease old by the
// server's clock. Meanwhile the new epoch is in the row at once (the old
// leader's writes are fenced) and the lock is held (another standby is
// told it is held).
func TestAcquireWaitsOutTheLeaseOfAFreeLock(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	cfg := leadership.Config{HeartbeatInterval: 200 * time.Millisecond, LeaderLease: 3 * time.Second, Instance: "new"}
	el := newElector(t, db, cfg)
	oldEpoch, hb := freeLockOf(ctx, t, db, "old")

	res := acquireAsync(ctx, el)
	waitEpoch(ctx, t, db, oldEpoch+1)
	other := cfg
	other.Instance = "other"
	otherEl := newElector(t, db, other)
	if _, err := otherEl.Acquire(ctx); !errors.Is(err, leadership.ErrHeld) {
		t.Errorf("another standby's Acquire while the new leader waits: %v, want ErrHeld", err)
	}
	var r acquired
	select {
	case r = <-res:
	case <-ctx.Done():
		t.Fatal("Acquire did not return")
	}
	if r.err != nil {
		t.Fatalf("Acquire: %v", r.err)
	}
	defer r.leader.Release(context.WithoutCancel(ctx))
	if since := sinceHeartbeat(ctx, t, db, hb); since < cfg.LeaderLease {
		t.Errorf("Acquire returned %v after the old leader's heartbeat, inside its lease of %v", since, cfg.LeaderLease)
	}
	if r.leader.Epoch() != oldEpoch+1 || !strings.Contains(r.leader.TookOver(), "old") || !r.leader.Valid() {
		t.Errorf("new leader: epoch %d (old %d), took over %q, valid %v", r.leader.Epoch(), oldEpoch, r.leader.TookOver(), r.leader.Valid())
	}
}

// The wait for a free lock's lease ends with the caller's context: Acquire
// returns the context's error, the lock is free again, and the row keeps
// the waiting leader's name and heartbeat, so the next one waits too.
func TestAcquireWaitEndsWithTheContext(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	cfg := leadership.Config{HeartbeatInterval: 200 * time.Millisecond, LeaderLease: 30 * time.Second, Instance: "new"}
	el := newElector(t, db, cfg)
	oldEpoch, _ := freeLockOf(ctx, t, db, "old")
	actx, cancel := context.WithCancel(ctx)
	res := acquireAsync(actx, el)
	waitEpoch(ctx, t, db, oldEpoch+1)
	cancel()
	r := <-res
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Acquire cancelled while waiting: %v, want context.Canceled", r.err)
	}
	var (
		holder sql.NullInt64
		leader sql.NullString
	)
	// The abandoned lock connection is closed, not released by a
	// statement: the server frees the lock once it has seen the close,
	// which a busy machine delays.
	wctx, wcancel := progress.Step(ctx)
	defer wcancel()
	for {
		if err := db.QueryRowContext(ctx, "SELECT IS_USED_LOCK('outbox-relay:default'), leader_instance FROM outbox_relay_progress").
			Scan(&holder, &leader); err != nil {
			t.Fatal(err)
		}
		if !holder.Valid || wctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if holder.Valid || leader.String != "new" {
		t.Errorf("after the cancelled wait: lock held by %v, leader_instance %v; want free, \"new\"", holder, leader)
	}
}

// A leader that released leadership has stopped publishing: the next one
// leads at once, without waiting out its lease; so does the same el
// after its own released term even when the row still names it (Release
// could not clear it).
func TestAcquireAfterReleaseDoesNotWait(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	cfg := leadership.Config{HeartbeatInterval: 200 * time.Millisecond, LeaderLease: 30 * time.Second, Instance: "a"}
	a := newElector(t, db, cfg)
	cfg.Instance = "b"
	b := newElector(t, db, cfg)
	for _, step := range []struct {
		first, next *leadership.Elector
		unclear     bool
	}{{a, b, false}, {a, a, true}} {
		l, err := step.first.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if step.unclear {
			mustExec(ctx, t, db, "UPDATE outbox_relay_progress SET leader_instance = 'a', leader_heartbeat = NOW(6)")
		}
		var hb string
		if err := db.QueryRowContext(ctx, "SELECT CAST(leader_heartbeat AS CHAR) FROM outbox_relay_progress").Scan(&hb); err != nil {
			t.Fatal(err)
		}
		next, err := step.next.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		since := sinceHeartbeat(ctx, t, db, hb)
		if since >= cfg.LeaderLease || next.TookOver() != "" {
			t.Errorf("leadership after a released term (row names it: %v) taken %v after its heartbeat (lease %v), took over %q",
				step.unclear, since, cfg.LeaderLease, next.TookOver())
		}
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// newElector is leadership.New on db with cfg, failing the test on error.
func newElector(t *testing.T, db *sql.DB, cfg leadership.Config) *leadership.Elector {
	t.Helper()
	el, err := leadership.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return el
}
