package leadership

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// ErrTableLed means another relay name leads the outbox table this relay
// name was to publish: two names on one table would each publish every
// row. Acquire returns it as a *TableLedError; retrying does not cure it.
var ErrTableLed = errors.New("another relay name publishes this outbox table")

// TableLedError is ErrTableLed with what the refused relay saw: the relay
// name that leads the table and its leader, as that name's progress row
// tells them.
type TableLedError struct {
	Database, Table string // the outbox table
	RelayName       string // the relay name refused (this one)
	// Other is the relay name whose leader holds the table; "" when no
	// progress row names a live leader of the table while a session holds
	// its lock (Conn).
	Other    string
	Instance string        // Other's leader_instance
	Age      time.Duration // how old its heartbeat is, by the server's clock
	Lease    time.Duration // the lease it runs with
	Conn     int64         // the connection that holds the table's lock; 0 when unknown
	More     []string      // further relay names with a live leader on the table
}

func (e *TableLedError) Error() string {
	lock := checkpoint.TableLockName(e.Database, e.Table)
	if e.Other == "" {
		return fmt.Sprintf("refusing to lead relay name %q: the lock %q of outbox table %q is held by connection %d, "+
			"which no relay name's progress row names as a live leader of that table (a relay of another name that is "+
			"stopping, or a session that took the lock by hand): find the connection in SHOW PROCESSLIST and end it, then start again",
			e.RelayName, lock, e.Table, e.Conn)
	}
	more := ""
	if len(e.More) > 0 {
		more = fmt.Sprintf(" (and relay names %q)", e.More)
	}
	return fmt.Sprintf("refusing to lead relay name %q: outbox table %q is already published by relay name %q%s, "+
		"leader %s, heartbeat %v old (lease %v); two relay names on one table would each publish every message. "+
		"Stop the relay of name %q, or give this one Config.RelayName %q so that one leads and the others stand by "+
		"(to move the table to another relay name on purpose, see \"Renaming a relay\" in docs/operations.md)",
		e.RelayName, e.Table, e.Other, more, e.Instance, e.Age.Round(time.Millisecond), e.Lease, e.Other, e.Other)
}

func (e *TableLedError) Is(target error) bool { return target == ErrTableLed }

// tableLeader is a progress row of another relay name that records this
// leader's table and names a leader.
type tableLeader struct {
	relayName, instance string
	age                 time.Duration // its heartbeat's age by the server's clock
	lease               time.Duration // its leader_lease_ms, or this elector's lease when not recorded
	// nameHeld: a session holds the relay name's lock. Read while this
	// leader holds the table's lock, it is a relay of that name starting
	// or being refused (it cannot lead the table), not a leader whose lock
	// connection is gone.
	nameHeld bool
}

// live reports whether the leader may still publish: its heartbeat is
// within its lease.
func (t tableLeader) live() bool { return t.age <= t.lease }

// claimTable takes the table's lock (checkpoint.TableLockName) on the lock
// connection, beside the name's, for the whole term. It runs after the
// epoch bump, which records the table and a fresh heartbeat in this
// name's row: so while a leader holds a table's lock, its row names the
// table with a heartbeat within its lease, and a relay of another name
// that finds the lock taken can tell who has it.
//
//   - The lock is free: taken. A leader of another name whose row still
//     names the table with a heartbeat within its lease and whose name's
//     lock is free (its lock connection was closed while it may still
//     publish what it read) is returned, to be waited out as a previous
//     leader of the same name is. One whose name's lock is held is a relay
//     of that name between its epoch bump and its refusal: not waited for.
//   - The lock is held and a row of another name names a live leader of
//     the table: a *TableLedError; the one already leading keeps leading.
//   - The lock is held and every row of another name that names a leader
//     of the table is stale (heartbeat older than its lease: a stopped or
//     hung process): its lock connection is killed and the lock taken.
//   - The lock is held and no row names a leader of the table (a leader
//     of another name between clearing its row and releasing its locks):
//     the lock is waited for up to a lease, then a *TableLedError.
func (l *Leader) claimTable(ctx context.Context) (previousLeader, error) {
	s := l.el
	name := l.tableLock
	got, holder, err := l.tryTableLock(ctx, 0)
	if err != nil {
		return previousLeader{}, err
	}
	others, err := l.tableLeaders(ctx)
	if err != nil {
		return previousLeader{}, err
	}
	if got {
		return waitFor(others), nil
	}
	refusal := &TableLedError{Database: l.database, Table: s.cfg.Table, RelayName: s.cfg.RelayName, Conn: holder}
	for _, o := range others {
		switch {
		case !o.live():
		case refusal.Other == "":
			refusal.Other, refusal.Instance, refusal.Age, refusal.Lease = o.relayName, o.instance, o.age, o.lease
		default:
			refusal.More = append(refusal.More, o.relayName)
		}
	}
	if refusal.Other != "" {
		return previousLeader{}, refusal
	}
	wait := time.Duration(0)
	if len(others) > 0 && holder != 0 {
		// The holder is most likely the stale leader that beat last.
		stale := others[0]
		for _, o := range others[1:] {
			if o.age < stale.age {
				stale = o
			}
		}
		// A stale leader of another name: end its lock connection, as
		// lock does for a stale leader of this name.
		if _, err := l.conn.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", holder)); err != nil && !isUnknownThread(err) {
			return previousLeader{}, fmt.Errorf("take lock %q of relay %q from relay name %q's stale leader %s (heartbeat %v old): kill its lock connection %d: %w",
				name, s.cfg.RelayName, stale.relayName, stale.instance, stale.age.Round(time.Millisecond), holder, err)
		}
		wait = 5 * time.Second
		l.addTakeover(fmt.Sprintf("took outbox table %q over from relay name %q's leader %s, whose heartbeat was %v old (lease %v)",
			s.cfg.Table, stale.relayName, stale.instance, stale.age.Round(time.Millisecond), stale.lease))
	} else {
		wait = s.cfg.LeaderLease
	}
	if got, holder, err = l.tryTableLock(ctx, wait); err != nil {
		return previousLeader{}, err
	}
	if !got {
		refusal.Conn = holder
		return previousLeader{}, refusal
	}
	return previousLeader{}, nil
}

// tryTableLock tries the table's lock on the lock connection, waiting up
// to wait, and returns the connection that holds it when that is not
// this one (0 when none does).
func (l *Leader) tryTableLock(ctx context.Context, wait time.Duration) (got bool, holder int64, _ error) {
	var ok, by sql.NullInt64
	if err := l.conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?), IS_USED_LOCK(?)", l.tableLock, wait.Seconds(), l.tableLock).
		Scan(&ok, &by); err != nil {
		return false, 0, fmt.Errorf("take lock %q of relay %q: %w", l.tableLock, l.el.cfg.RelayName, err)
	}
	return ok.Valid && ok.Int64 == 1, by.Int64, nil
}

// tableLeaders reads the progress rows of the other relay names that
// record this leader's table and name a leader, longest leading first.
func (l *Leader) tableLeaders(ctx context.Context) ([]tableLeader, error) {
	s := l.el
	rows, err := l.conn.QueryContext(ctx, `SELECT relay_name, leader_instance,
		TIMESTAMPDIFF(MICROSECOND, leader_heartbeat, NOW(6)), leader_lease_ms,
		IS_USED_LOCK(CONCAT(?, relay_name)) IS NOT NULL FROM outbox_relay_progress
		WHERE outbox_table = ? AND relay_name <> ? AND leader_instance IS NOT NULL ORDER BY leader_since, relay_name`,
		checkpoint.LockName(""), s.cfg.Table, s.cfg.RelayName)
	if err != nil {
		return nil, fmt.Errorf("read the other relay names of outbox table %q: %w", s.cfg.Table, err)
	}
	defer rows.Close()
	var list []tableLeader
	for rows.Next() {
		var (
			o            tableLeader
			ageUS, lease sql.NullInt64
		)
		if err := rows.Scan(&o.relayName, &o.instance, &ageUS, &lease, &o.nameHeld); err != nil {
			return nil, fmt.Errorf("read the other relay names of outbox table %q: %w", s.cfg.Table, err)
		}
		o.age, o.lease = time.Duration(ageUS.Int64)*time.Microsecond, s.cfg.LeaderLease
		if !ageUS.Valid {
			o.age = time.Duration(1<<63 - 1) // no heartbeat ever: stale
		}
		if lease.Valid && lease.Int64 > 0 {
			o.lease = time.Duration(lease.Int64) * time.Millisecond
		}
		list = append(list, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the other relay names of outbox table %q: %w", s.cfg.Table, err)
	}
	return list, nil
}

// waitFor is the live leader of others whose lease ends last and whose
// name's lock is free, as a previous leader to wait out; none when there
// is no such one.
func waitFor(others []tableLeader) previousLeader {
	var p previousLeader
	for _, o := range others {
		if o.live() && !o.nameHeld && o.lease-o.age > p.wait {
			p = previousLeader{relayName: o.relayName, instance: o.instance, age: o.age, lease: o.lease, wait: o.lease - o.age}
		}
	}
	return p
}
