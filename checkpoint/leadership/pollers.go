package leadership

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// endPollers ends the connections of the relay name's poll workers and
// acknowledgements that still live when this leader takes over from one that
// did not release leadership: a stopped (or hung, or cut off) process keeps
// its connections, and a poll round's transaction on one of them keeps its
// partitions' heads locked, so this leader's FOR UPDATE SKIP LOCKED would
// skip those partitions for as long as that process stays stopped
// (wait_timeout, hours); an acknowledgement stopped before its commit keeps
// the rows it deleted locked, and this leader's acknowledgement of the same
// rows would wait on them as long. Each such connection holds a poll lock
// (checkpoint.PollLockName, taken by package poller and by
// checkpoint.Store.Ack): IS_USED_LOCK names it, which needs no privilege
// and finds only connections of this relay name's workers, never an
// application's. It is ended with KILL CONNECTION, which the relay's user
// may do to its own connections (another user's needs CONNECTION ADMIN or
// SUPER). Their transactions roll back: rows they claimed are pending again
// and are published again (at least once); none was acknowledged. No poll
// worker of this process runs during Acquire, so every holder is stale (the
// acknowledging connection of this process's earlier term included: its
// next acknowledgement opens another).
//
// A failure is logged, not returned: leading with some partitions held
// (until the stale process wakes, or the server drops its connections)
// beats not leading at all. It runs on the pool: after the takeover's wait
// the lock connection is busy watching the lock.
func (l *Leader) endPollers(ctx context.Context) {
	s := l.el
	ids, err := l.pollHolders(ctx)
	if err != nil {
		s.cfg.Logger.Warn("cannot look for the poll connections of the previous leader; partitions whose heads they lock "+
			"stay held until it wakes or the server ends them", zap.String("relay", s.cfg.RelayName), zap.Error(err))
		return
	}
	var ended []int64
	var failed error
	for _, id := range ids {
		_, err := s.db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id))
		switch {
		case err == nil:
			ended = append(ended, id)
		case isUnknownThread(err):
			// Gone meanwhile.
		default:
			failed = errors.Join(failed, fmt.Errorf("connection %d: %w", id, err))
		}
	}
	if len(ended) > 0 {
		s.cfg.Logger.Warn(fmt.Sprintf("ended %d poll connections of the previous leader: their rounds and acknowledgements roll back, "+
			"their rows are pending again and will be published again", len(ended)),
			zap.String("relay", s.cfg.RelayName), zap.Int64s("connections", ended))
	}
	if failed != nil {
		hint := ""
		var me *mysql.MySQLError
		if errors.As(failed, &me) && me.Number == 1095 { // ER_KILL_DENIED_ERROR
			hint = ": run every instance of the relay name as one MySQL user, or grant the relay's user CONNECTION ADMIN"
		}
		s.cfg.Logger.Warn("cannot end the poll connections of the previous leader; partitions whose heads they lock "+
			"stay held until it wakes or the server ends them"+hint, zap.String("relay", s.cfg.RelayName), zap.Error(failed))
	}
}

// pollHolders returns the ids of the connections that hold a poll lock of
// the relay name (other than this leader's lock connection), in one
// statement.
func (l *Leader) pollHolders(ctx context.Context) ([]int64, error) {
	s := l.el
	var q strings.Builder
	args := make([]any, 0, checkpoint.PollLockSlots)
	q.WriteString("SELECT DISTINCT h FROM (")
	for slot := range checkpoint.PollLockSlots {
		if slot > 0 {
			q.WriteString(" UNION ALL ")
		}
		q.WriteString("SELECT IS_USED_LOCK(?) AS h")
		args = append(args, checkpoint.PollLockName(s.cfg.RelayName, slot))
	}
	q.WriteString(") AS holders WHERE h IS NOT NULL")
	rows, err := s.db.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("find the poll connections of relay %q (IS_USED_LOCK): %w", s.cfg.RelayName, err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("find the poll connections of relay %q: %w", s.cfg.RelayName, err)
		}
		if id != l.connID {
			ids = append(ids, id)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("find the poll connections of relay %q: %w", s.cfg.RelayName, err)
	}
	return ids, nil
}
