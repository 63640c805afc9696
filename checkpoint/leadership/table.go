package leadership

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ErrTableLed means another relay name leads the outbox table this relay
// name was to publish: two names on one table would each publish every
// row. Acquire returns it as a *TableLedError; retrying does not cure it.
var ErrTableLed = errors.New("another relay name publishes this outbox table")

// TableLedError is ErrTableLed with what the refused relay saw: the relay
// name that leads the table and its leader, as that name's progress row
// tells them. It is returned only when the connection holding the table's
// lock is the lock connection that a live leader row of another name
// records (leader_conn_id).
type TableLedError struct {
	Database, Table string // the outbox table
	RelayName       string // the relay name refused (this one)
	// Other is the relay name whose leader holds the table's lock.
	Other    string
	Instance string        // Other's leader_instance
	Age      time.Duration // how old its heartbeat is, by the server's clock
	Lease    time.Duration // the lease it runs with
	More     []string      // further relay names with a live leader row on the table
}

func (e *TableLedError) Error() string {
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
	conn                int64         // its leader_conn_id: the lock connection that takes the table's lock; 0 when not recorded
}

// live reports whether the leader may still publish: its heartbeat is
// within its lease.
func (t tableLeader) live() bool { return t.age <= t.lease }

// holderKind is who holds the table's lock, as identify tells it.
type holderKind int

const (
	// holderUnknown: no row records the connection (a session that took
	// the lock by hand, a leader of another version, or the lock was
	// released between the two reads): wait for it, never refuse or kill.
	holderUnknown holderKind = iota
	// holderPredecessor: this relay name's previous leader, whose locks
	// the server is still releasing or whose lease is waited out anyway.
	holderPredecessor
	// holderLive: a live leader of another relay name: refuse.
	holderLive
	// holderStale: a leader of another relay name whose heartbeat is
	// older than its lease (a stopped or hung process): kill it.
	holderStale
)

// identify tells who the connection holder, which holds the table's lock,
// is: the lock connection recorded by a live leader row of another name
// (that row is returned), this name's previous leader's (prevConn, read
// before the epoch bump), the one recorded by a stale leader row of
// another name (returned), or none of them. A live row is looked for
// first: a connection id recorded twice (the server restarted and reuses
// ids) belongs to the newer term, the live one.
func identify(holder int64, others []tableLeader, prevConn int64) (holderKind, tableLeader) {
	if holder == 0 {
		return holderUnknown, tableLeader{}
	}
	for _, o := range others {
		if o.conn == holder && o.live() {
			return holderLive, o
		}
	}
	if holder == prevConn {
		return holderPredecessor, tableLeader{}
	}
	for _, o := range others {
		if o.conn == holder {
			return holderStale, o
		}
	}
	return holderUnknown, tableLeader{}
}

// claimTableBound is the longest claimTable waits for the table's lock: half
// the validity, so that a term does not begin with its lease nearly spent
// (the lease counts from before the epoch bump).
func (s *Elector) claimTableBound() time.Duration { return s.validity() / 2 }

// claimTable takes the table's lock (checkpoint.TableLockName) on the lock
// connection, beside the name's, for the whole term. It runs after the
// epoch bump, which records the table, the lease, a fresh heartbeat and
// the lock connection's id (leader_conn_id) in this name's row: so while a
// leader holds a table's lock, its row records the connection that holds
// it, and a relay of another name that finds the lock taken can tell who
// has it (IS_USED_LOCK, identify).
//
//   - The lock is free: taken. Every leader row of another name that still
//     records the table with a heartbeat within its lease is a leader that
//     may still publish what it read (its lock connection was closed, or
//     it is starting and will be refused): the one whose lease ends last
//     is returned, to be waited out as a previous leader of the same name
//     is.
//   - Held by a live leader of another name: a *TableLedError built from
//     the rows read after the lock was found held; the one leading keeps
//     leading.
//   - Held by a stale leader of another name: its connection is killed
//     and the lock taken.
//   - Held by this name's previous leader, or by a connection no row
//     records: waited for, up to claimTableBound; then an error that is
//     not ErrTableLed (the caller retries).
func (l *Leader) claimTable(ctx context.Context) (previousLeader, error) {
	s := l.el
	deadline := time.Now().Add(s.claimTableBound())
	wait := time.Duration(0)
	for {
		got, holder, err := l.tryTableLock(ctx, wait)
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
		kind, o := identify(holder, others, l.prevConn)
		switch kind {
		case holderLive:
			return previousLeader{}, l.refusal(o, others)
		case holderStale:
			if err := l.killStale(ctx, holder, o); err != nil {
				return previousLeader{}, err
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			who := "a connection that no relay name's progress row records"
			if kind == holderPredecessor {
				who = fmt.Sprintf("the lock connection of relay %q's previous leader", s.cfg.RelayName)
			}
			return previousLeader{}, fmt.Errorf("take lock %q of outbox table %q for relay %q: held by connection %d (%s) for %v; trying again later",
				l.tableLock, s.cfg.Table, s.cfg.RelayName, holder, who, s.claimTableBound())
		}
		// GET_LOCK returns as soon as the holder lets go.
		wait = min(left, 500*time.Millisecond)
	}
}

// refusal is the *TableLedError of a table whose lock the live leader o of
// another relay name holds; others are the rows read with it.
func (l *Leader) refusal(o tableLeader, others []tableLeader) *TableLedError {
	s := l.el
	e := &TableLedError{Database: l.database, Table: s.cfg.Table, RelayName: s.cfg.RelayName,
		Other: o.relayName, Instance: o.instance, Age: o.age, Lease: o.lease}
	for _, m := range others {
		if m.live() && m.relayName != o.relayName {
			e.More = append(e.More, m.relayName)
		}
	}
	return e
}

// killStale ends the connection holder, which holds the table's lock and
// which the stale leader row o of another name records, as lock does for a
// stale leader of this name; the server then releases the lock.
func (l *Leader) killStale(ctx context.Context, holder int64, o tableLeader) error {
	s := l.el
	if _, err := l.conn.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", holder)); err != nil && !isUnknownThread(err) {
		return fmt.Errorf("take lock %q of relay %q from relay name %q's stale leader %s (heartbeat %v old): kill its lock connection %d: %w",
			l.tableLock, s.cfg.RelayName, o.relayName, o.instance, o.age.Round(time.Millisecond), holder, err)
	}
	l.addTakeover(fmt.Sprintf("took outbox table %q over from relay name %q's leader %s, whose heartbeat was %v old (lease %v)",
		s.cfg.Table, o.relayName, o.instance, o.age.Round(time.Millisecond), o.lease))
	return nil
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
		TIMESTAMPDIFF(MICROSECOND, leader_heartbeat, NOW(6)), leader_lease_ms, leader_conn_id
		FROM outbox_relay_progress
		WHERE outbox_table = ? AND relay_name <> ? AND leader_instance IS NOT NULL ORDER BY leader_since, relay_name`,
		s.cfg.Table, s.cfg.RelayName)
	if err != nil {
		return nil, fmt.Errorf("read the other relay names of outbox table %q: %w", s.cfg.Table, err)
	}
	defer rows.Close()
	var list []tableLeader
	for rows.Next() {
		var (
			o                  tableLeader
			ageUS, lease, conn sql.NullInt64
		)
		if err := rows.Scan(&o.relayName, &o.instance, &ageUS, &lease, &conn); err != nil {
			return nil, fmt.Errorf("read the other relay names of outbox table %q: %w", s.cfg.Table, err)
		}
		o.age, o.lease, o.conn = time.Duration(ageUS.Int64)*time.Microsecond, s.cfg.LeaderLease, conn.Int64
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

// waitFor is the live leader of others whose lease ends last, as a
// previous leader to wait out; none when no leader of others is live. It
// is called with the table's lock free, so a live leader of another name
// lost its lock connection and may still publish until its lease ends (or
// a relay of that name is starting and will be refused: then the wait is
// for nothing, but a standby of that name may take its name's lock at the
// moment its leader's connection is cut, so a held name lock proves
// nothing).
func waitFor(others []tableLeader) previousLeader {
	var p previousLeader
	for _, o := range others {
		if o.live() && o.lease-o.age > p.wait {
			p = previousLeader{relayName: o.relayName, instance: o.instance, age: o.age, lease: o.lease, wait: o.lease - o.age}
		}
	}
	return p
}
