package leadership_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// tableCfg is the leadership of relay name name in the table tests: a 2 s
// lease, waited out within the tests, and a heartbeat of 500 ms, whose
// statement may take up to a second (two intervals) before the term ends.
// With 200 ms, a heartbeat UPDATE slower than 400 ms on a busy machine ended
// a term while it waited out another name's lease
// (TestAcquireRaceOneRelayNamePerTable failed so beside the whole suite).
func tableCfg(name string) leadership.Config {
	return leadership.Config{RelayName: name, Instance: name + "-1", HeartbeatInterval: 500 * time.Millisecond, LeaderLease: 2 * time.Second}
}

// tableLock is the lock of db's default outbox table.
func tableLock(ctx context.Context, t *testing.T, db *sql.DB) string {
	t.Helper()
	var database string
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&database); err != nil {
		t.Fatal(err)
	}
	return checkpoint.TableLockName(database, "outbox")
}

// tableLockHolder is the connection holding the default outbox table's
// lock, 0 when none.
func tableLockHolder(ctx context.Context, t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var holder sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", tableLock(ctx, t, db)).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	return holder.Int64
}

// A leader of a second relay name on a table already led is refused with a
// TableLedError naming the first name, its instance and heartbeat age; its
// row names no leader afterwards; the first keeps leading (its heartbeats
// go on) and a relay name on another table is not concerned.
func TestAcquireRefusesSecondRelayNameOnTable(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	first, err := newElector(t, db, tableCfg("acc")).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release(context.WithoutCancel(ctx))

	_, err = newElector(t, db, tableCfg("acc-other")).Acquire(ctx)
	var led *leadership.TableLedError
	if !errors.As(err, &led) || !errors.Is(err, leadership.ErrTableLed) {
		t.Fatalf("second relay name on the table: %v, want a TableLedError", err)
	}
	if led.Other != "acc" || led.Instance != "acc-1" || led.Age > 2*time.Second || led.Lease != 2*time.Second {
		t.Fatalf("refusal %+v: want relay name acc, instance acc-1, a fresh heartbeat, lease 2s", led)
	}
	for _, want := range []string{`relay name "acc-other"`, `relay name "acc"`, "acc-1", "heartbeat", "Stop the relay", `Config.RelayName "acc"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	var instance sql.NullString
	var table string
	if err := db.QueryRowContext(ctx, "SELECT leader_instance, outbox_table FROM outbox_relay_progress WHERE relay_name = 'acc-other'").
		Scan(&instance, &table); err != nil {
		t.Fatal(err)
	}
	if instance.Valid || table != "outbox" {
		t.Fatalf("refused relay's row: leader %v, table %q; want no leader, table outbox", instance, table)
	}

	// The first leads on: several heartbeats later it is valid, not lost.
	other := tableCfg("elsewhere")
	other.Table = "outbox2"
	elsewhere, err := newElector(t, db, other).Acquire(ctx)
	if err != nil {
		t.Fatalf("a relay name on another table: %v", err)
	}
	defer elsewhere.Release(context.WithoutCancel(ctx))
	var hb1, hb2 time.Time
	if err := db.QueryRowContext(ctx, "SELECT leader_heartbeat FROM outbox_relay_progress WHERE relay_name = 'acc'").Scan(&hb1); err != nil {
		t.Fatal(err)
	}
	for hb2.Sub(hb1) < 3*other.HeartbeatInterval {
		select {
		case <-first.Lost():
			t.Fatalf("the first leader lost leadership: %v", first.Err())
		case <-ctx.Done():
			t.Fatal("the first leader's heartbeat does not move")
		case <-time.After(50 * time.Millisecond):
		}
		if err := db.QueryRowContext(ctx, "SELECT leader_heartbeat FROM outbox_relay_progress WHERE relay_name = 'acc'").Scan(&hb2); err != nil {
			t.Fatal(err)
		}
	}
	if !first.Valid() {
		t.Fatal("the first leader is not valid")
	}
}

// Two relay names on one table taking leadership at the same moment: in
// every round exactly one leads, the other is refused.
func TestAcquireRaceOneRelayNamePerTable(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	els := []*leadership.Elector{newElector(t, db, tableCfg("a")), newElector(t, db, tableCfg("b"))}
	for round := range 10 {
		var wg sync.WaitGroup
		leaders := make([]*leadership.Leader, len(els))
		errs := make([]error, len(els))
		start := make(chan struct{})
		for i, el := range els {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				leaders[i], errs[i] = el.Acquire(ctx)
			}()
		}
		close(start)
		wg.Wait()
		won := 0
		for i := range els {
			switch {
			case errs[i] == nil:
				won++
			case !errors.Is(errs[i], leadership.ErrTableLed):
				t.Fatalf("round %d: elector %d: %v, want leadership or ErrTableLed", round, i, errs[i])
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d relay names lead the table (errors %v), want exactly 1", round, won, errs)
		}
		for _, l := range leaders {
			if l != nil {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// A stale leader of another relay name does not block: one that holds the
// table's lock (a stopped process, its connection open: the connection its
// row records) with a heartbeat older than its recorded lease is taken
// over, its lock connection killed;
// one whose row alone is left (a killed process) is ignored, no wait.
func TestAcquireTakesTableFromStaleRelayName(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	stale, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()
	var got, staleID int64
	if err := stale.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0), CONNECTION_ID()", tableLock(ctx, t, db)).Scan(&got, &staleID); err != nil || got != 1 {
		t.Fatalf("take the table's lock: %d, %v", got, err)
	}
	for _, name := range []string{"old", "older"} {
		if err := checkpoint.EnsureRow(ctx, db, name); err != nil {
			t.Fatal(err)
		}
	}
	// "old" holds the lock, its heartbeat older than its 1.5 s lease;
	// "older" died long ago without clearing its row.
	mustExec(ctx, t, db, fmt.Sprintf(`UPDATE outbox_relay_progress SET epoch = epoch + 1, leader_instance = 'stale', outbox_table = 'outbox',
		leader_since = NOW(6) - INTERVAL 1 HOUR, leader_heartbeat = NOW(6) - INTERVAL 3 SECOND, leader_lease_ms = 1500,
		leader_conn_id = %d WHERE relay_name = 'old'`, staleID))
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET epoch = epoch + 1, leader_instance = 'dead', outbox_table = 'outbox',
		leader_since = NOW(6) - INTERVAL 2 HOUR, leader_heartbeat = NOW(6) - INTERVAL 1 HOUR WHERE relay_name = 'older'`)
	began := time.Now()
	leader, err := newElector(t, db, tableCfg("new")).Acquire(ctx)
	if err != nil {
		t.Fatalf("take the table from stale relay names: %v", err)
	}
	defer leader.Release(context.WithoutCancel(ctx))
	if took := time.Since(began); took > time.Second {
		t.Errorf("Acquire took %v: a stale relay name is not waited for", took)
	}
	if !strings.Contains(leader.TookOver(), `relay name "old"`) {
		t.Errorf("TookOver %q does not name the stale relay name", leader.TookOver())
	}
	if holder := tableLockHolder(ctx, t, db); holder == 0 || holder == staleID {
		t.Errorf("the table's lock is held by connection %d (the stale one is %d)", holder, staleID)
	}
}

// A leader of another relay name whose lock is free but whose heartbeat is
// within its lease (its lock connection closed while the process may still
// publish) is waited out before Acquire returns, as a previous leader of
// the same name is.
func TestAcquireWaitsOutOtherRelayNameLease(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	if err := checkpoint.EnsureRow(ctx, db, "gone"); err != nil {
		t.Fatal(err)
	}
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET epoch = 1, leader_instance = 'cut', outbox_table = 'outbox',
		leader_since = NOW(6), leader_heartbeat = NOW(6), leader_lease_ms = 1500 WHERE relay_name = 'gone'`)
	began := time.Now()
	leader, err := newElector(t, db, tableCfg("next")).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Release(context.WithoutCancel(ctx))
	if took := time.Since(began); took < time.Second {
		t.Errorf("Acquire returned after %v, inside the other relay name's 1.5 s lease", took)
	}
	if !strings.Contains(leader.TookOver(), `relay name "gone"`) {
		t.Errorf("TookOver %q does not name the relay name waited out", leader.TookOver())
	}
}

// holdTableLock takes the default outbox table's lock on a connection of
// its own and returns it and its id.
func holdTableLock(ctx context.Context, t *testing.T, db *sql.DB) (*sql.Conn, int64) {
	t.Helper()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var got, id int64
	if err := c.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0), CONNECTION_ID()", tableLock(ctx, t, db)).Scan(&got, &id); err != nil || got != 1 {
		t.Fatalf("take the table's lock: %d, %v", got, err)
	}
	return c, id
}

// A connection holding the table's lock that no progress row records (a
// session that took it by hand) is neither killed nor a reason to refuse,
// even beside a stale leader row of another name: Acquire waits for it a
// bounded time (well inside the lease) and fails with an error to retry,
// and the failed term's row keeps its leader and heartbeat (a database
// error is not the end of a term: the next leader waits its lease out).
func TestAcquireWaitsForUnknownTableLockHolder(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	holder, holderID := holdTableLock(ctx, t, db)
	if err := checkpoint.EnsureRow(ctx, db, "old"); err != nil {
		t.Fatal(err)
	}
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET epoch = epoch + 1, leader_instance = 'stale', outbox_table = 'outbox',
		leader_since = NOW(6) - INTERVAL 1 HOUR, leader_heartbeat = NOW(6) - INTERVAL 1 HOUR, leader_conn_id = 1 WHERE relay_name = 'old'`)
	cfg := tableCfg("new")
	began := time.Now()
	_, err := newElector(t, db, cfg).Acquire(ctx)
	took := time.Since(began)
	if err == nil || errors.Is(err, leadership.ErrTableLed) || errors.Is(err, leadership.ErrHeld) {
		t.Fatalf("Acquire with the table's lock held by an unknown connection: %v, want an error to retry", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprint(holderID)) {
		t.Errorf("error %q does not name the holding connection %d", err, holderID)
	}
	if took > cfg.LeaderLease*3/4 {
		t.Errorf("Acquire waited %v for the table's lock, not clearly inside the %v lease", took, cfg.LeaderLease)
	}
	if err := holder.PingContext(ctx); err != nil {
		t.Fatalf("the unknown holder's connection was ended: %v", err)
	}
	if h := tableLockHolder(ctx, t, db); h != holderID {
		t.Fatalf("the table's lock is held by %d, want still %d", h, holderID)
	}
	var instance sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT leader_instance FROM outbox_relay_progress WHERE relay_name = 'new'").Scan(&instance); err != nil {
		t.Fatal(err)
	}
	if instance.String != "new-1" {
		t.Fatalf("the failed term's row names leader %v, want new-1 kept", instance)
	}
}

// A live leader of another relay name whose table lock is free is waited
// out even when a session holds that name's lock: a standby of that name
// takes it the moment its leader's lock connection is cut, while that
// leader may still publish until its lease ends.
func TestAcquireWaitsOutOtherRelayNameWhileItsStandbyHoldsTheName(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	if err := checkpoint.EnsureRow(ctx, db, "gone"); err != nil {
		t.Fatal(err)
	}
	standby, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	var got int64
	if err := standby.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", checkpoint.LockName("gone")).Scan(&got); err != nil || got != 1 {
		t.Fatalf("take relay name gone's lock: %d, %v", got, err)
	}
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET epoch = 1, leader_instance = 'cut', outbox_table = 'outbox',
		leader_since = NOW(6), leader_heartbeat = NOW(6), leader_lease_ms = 1500, leader_conn_id = 1 WHERE relay_name = 'gone'`)
	began := time.Now()
	leader, err := newElector(t, db, tableCfg("next")).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Release(context.WithoutCancel(ctx))
	if took := time.Since(began); took < time.Second {
		t.Errorf("Acquire returned after %v, inside the other relay name's 1.5 s lease", took)
	}
}

// A relay refused while it waited out its own name's previous leader (whose
// lock connection is gone, lease running) keeps its row's leader and fresh
// heartbeat: clearing them would let the next leader of the name publish
// beside the previous one. The next Acquire waits out the refused term's
// lease.
func TestAcquireRefusedWhileWaitingOutKeepsRow(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	x, err := newElector(t, db, tableCfg("x")).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.EnsureRow(ctx, db, "y"); err != nil {
		t.Fatal(err)
	}
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET epoch = 1, leader_instance = 'cut', outbox_table = 'outbox',
		leader_since = NOW(6), leader_heartbeat = NOW(6), leader_lease_ms = 2000, leader_conn_id = 1 WHERE relay_name = 'y'`)
	y := newElector(t, db, tableCfg("y"))
	if _, err := y.Acquire(ctx); !errors.Is(err, leadership.ErrTableLed) {
		t.Fatalf("y while x leads: %v, want ErrTableLed", err)
	}
	var instance sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT leader_instance FROM outbox_relay_progress WHERE relay_name = 'y'").Scan(&instance); err != nil {
		t.Fatal(err)
	}
	if instance.String != "y-1" {
		t.Fatalf("refused y's row names leader %v, want y-1 kept", instance)
	}
	if err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	leader, err := y.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Release(context.WithoutCancel(ctx))
	if took := time.Since(began); took < time.Second {
		t.Errorf("y's next Acquire returned after %v, inside its refused term's 2 s lease", took)
	}
}

// A successor of the same name that finds the table's lock still held by
// its predecessor's lock connection (the server releases a session's locks
// one after another) waits for it, neither refused (even beside a live row
// of another name that holds nothing) nor killing it.
func TestAcquireWaitsForPredecessorTableLock(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	pred, predID := holdTableLock(ctx, t, db)
	for _, name := range []string{"y", "z"} {
		if err := checkpoint.EnsureRow(ctx, db, name); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(ctx, t, db, fmt.Sprintf(`UPDATE outbox_relay_progress SET epoch = 1, leader_instance = NULL, outbox_table = 'outbox',
		leader_since = NOW(6), leader_heartbeat = NOW(6), leader_lease_ms = 2000, leader_conn_id = %d WHERE relay_name = 'y'`, predID))
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET epoch = 1, leader_instance = 'z-1', outbox_table = 'outbox',
		leader_since = NOW(6), leader_heartbeat = NOW(6), leader_lease_ms = 1000, leader_conn_id = 1 WHERE relay_name = 'z'`)
	type result struct {
		l   *leadership.Leader
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := newElector(t, db, tableCfg("y")).Acquire(ctx)
		done <- result{l, err}
	}()
	// Let go of the predecessor's table lock once the successor waits for it.
	for waiting := 0; waiting == 0; {
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE INFO LIKE 'SELECT GET_LOCK(%' AND STATE LIKE '%lock%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			t.Fatalf("Acquire returned before the predecessor let go of the table's lock: %v", r.err)
		case <-ctx.Done():
			t.Fatal("the successor never waits for the table's lock")
		case <-time.After(10 * time.Millisecond):
		}
	}
	var released int64
	if err := pred.QueryRowContext(ctx, "SELECT RELEASE_LOCK(?)", tableLock(ctx, t, db)).Scan(&released); err != nil || released != 1 {
		t.Fatalf("release the predecessor's table lock: %d, %v (was it killed?)", released, err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("successor of the same name: %v, want leadership", r.err)
	}
	defer r.l.Release(context.WithoutCancel(ctx))
}
