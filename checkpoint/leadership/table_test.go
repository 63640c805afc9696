package leadership_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// tableCfg is a leadership config of relay name on the default outbox
// table, with a short lease.
func tableCfg(name string) leadership.Config {
	return leadership.Config{RelayName: name, Instance: name + "-1", HeartbeatInterval: 200 * time.Millisecond, LeaderLease: 2 * time.Second}
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
	for hb2.Sub(hb1) < 600*time.Millisecond {
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
// table's lock (a stopped process, its connection open) with a heartbeat
// older than its recorded lease is taken over, its lock connection killed;
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
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET epoch = epoch + 1, leader_instance = 'stale', outbox_table = 'outbox',
		leader_since = NOW(6) - INTERVAL 1 HOUR, leader_heartbeat = NOW(6) - INTERVAL 3 SECOND, leader_lease_ms = 1500 WHERE relay_name = 'old'`)
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
