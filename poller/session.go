package poller

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// A worker's rounds run on a database connection of its own, which holds
// one of the relay name's poll locks (checkpoint.PollLockName) for as long
// as it lives. A round holds its partitions' heads locked while it waits for
// the broker; a relay process stopped in that wait (SIGSTOP, a VM pause, a
// long stall) keeps its connections, its transaction and so those row locks,
// and the next leader's FOR UPDATE SKIP LOCKED would skip those partitions
// until the server drops the connection (wait_timeout: hours). The lock is
// how the next leader finds the connection: IS_USED_LOCK gives its id, which
// it ends with KILL CONNECTION at its takeover (package leadership), with no
// privilege beyond the one a user has over its own connections, and without
// ever touching a connection that is not a relay's. The transaction rolls
// back: its rows are pending again (published again, at least once), and a
// woken stale process finds its connection gone and its round failed.

// pingAfter is how long a worker's connection may go unused before its next
// round pings it first: the server may have closed it meanwhile
// (wait_timeout, a proxy's idle timeout), and a round that found that out
// would fail and be retried, logged as a failure.
const pingAfter = 30 * time.Second

// session returns the worker's connection, opening it and taking a free poll
// lock first when it has none (or the one it had, unused for pingAfter, does
// not answer a ping).
func (w *worker) session(ctx context.Context) (*sql.Conn, error) {
	if w.conn != nil && time.Since(w.used) >= pingAfter && w.conn.PingContext(ctx) != nil {
		w.endSession()
	}
	if w.conn != nil {
		w.used = time.Now()
		return w.conn, nil
	}
	p := w.p
	conn, err := p.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("open the connection of poll worker %s: %w", w.name(), err)
	}
	// Worker i looks first at slot i, the due-time sweeper past the
	// workers, so each usually takes its first try.
	start := w.id
	if start < 0 {
		start = maxWorkers
	}
	slot, err := checkpoint.TakePollLock(ctx, conn, p.relayName, start)
	if err != nil {
		checkpoint.DiscardConn(conn)
		return nil, fmt.Errorf("poll worker %s: %w", w.name(), err)
	}
	if slot >= 0 {
		w.conn, w.used = conn, time.Now()
		return conn, nil
	}
	checkpoint.DiscardConn(conn)
	return nil, fmt.Errorf("poll worker %s: all %d poll locks of relay %q (%s…) are held by other connections: "+
		"more poll workers of this relay name run at once than there are locks, or a stopped relay process still holds "+
		"them; the next takeover ends a stopped process's connections (or end them with KILL CONNECTION of IS_USED_LOCK(name))",
		w.name(), checkpoint.PollLockSlots, p.relayName, checkpoint.PollLockName(p.relayName, 0))
}

// endSession closes the worker's connection, which releases its poll lock:
// after the worker's last round, and after a failed round (the connection
// may be broken, or was ended by a newer leader).
func (w *worker) endSession() {
	if w.conn != nil {
		checkpoint.DiscardConn(w.conn)
		w.conn = nil
	}
}

// name is how errors name the worker: its number, or "delayed" for the
// due-time sweeper.
func (w *worker) name() string {
	if w.id < 0 {
		return "delayed"
	}
	return fmt.Sprint(w.id)
}
