package checkpoint

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// ackSession is where Store.Ack runs its transactions: a database connection
// of its own that holds one of the relay name's poll locks (PollLockName).
//
// An acknowledgement deletes (or marks) its rows before it checks the epoch
// and commits. A process stopped in between (SIGSTOP, a paused VM, a stall
// of minutes) keeps that transaction, and the locks on those rows, for as
// long as its connection lives: wait_timeout, hours. The next leader
// acknowledges the same rows (it published them again), so its
// acknowledgement would wait on those locks, fail after
// innodb_lock_wait_timeout and retry, for as long, its in-flight budget
// spent and its reading stopped. The poll lock is how the next leader's
// takeover finds the connection and ends it (package leadership), as it ends
// a stopped process's poll workers: the transaction rolls back, nothing of it
// was committed, and the new leader acknowledges those rows itself.
//
// The connection is kept from one Ack to the next (Store.ackMu), and closed
// after an error.
type ackSession struct {
	s    *Store
	conn *sql.Conn
	// afterRows, when set (tests), runs inside each acknowledging
	// transaction once its rows are acknowledged.
	afterRows func()
}

// ackLockSlot is the poll lock slot the session tries first: the last, so
// that poll workers (which start at their number) usually find theirs free.
const ackLockSlot = PollLockSlots - 1

// ack is Store.Ack on the session's connection, opened (with a poll lock)
// when it has none. A connection kept from an earlier call may have ended
// meanwhile (a takeover by this very process ends the connections of its
// earlier terms too, and the server ends idle ones after wait_timeout): a
// failure on it is retried once on a fresh connection, which is safe because
// acknowledging is idempotent (see Ack).
func (a *ackSession) ack(ctx context.Context, epoch int64, ack Ack) error {
	kept := a.conn != nil
	err := a.try(ctx, epoch, ack)
	if err != nil && kept && !errors.Is(err, ErrFenced) && ctx.Err() == nil {
		err = a.try(ctx, epoch, ack)
	}
	return err
}

func (a *ackSession) try(ctx context.Context, epoch int64, ack Ack) error {
	if a.conn == nil {
		if err := a.open(ctx); err != nil {
			return err
		}
	}
	err := a.s.ack(ctx, a.conn, a.afterRows, epoch, ack)
	if err != nil {
		a.close() // broken, ended by a newer leader, or in an unknown state
	}
	return err
}

func (a *ackSession) open(ctx context.Context) error {
	name := a.s.cfg.RelayName
	conn, err := a.s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("acknowledge: open a connection: %w", err)
	}
	slot, err := TakePollLock(ctx, conn, name, ackLockSlot)
	if err != nil {
		DiscardConn(conn)
		return fmt.Errorf("acknowledge: %w", err)
	}
	if slot < 0 {
		DiscardConn(conn)
		return fmt.Errorf("acknowledge: all %d poll locks of relay %q (%s…) are held by other connections: a stopped "+
			"relay process may still hold them; the next takeover ends its connections (or end them with KILL "+
			"CONNECTION of IS_USED_LOCK(name))", PollLockSlots, name, PollLockName(name, 0))
	}
	a.conn = conn
	return nil
}

// close closes the session's connection, which releases its poll lock; the
// next ack opens another.
func (a *ackSession) close() {
	if a.conn != nil {
		DiscardConn(a.conn)
		a.conn = nil
	}
}
