package relay

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// backlogEvery is how often the leader counts the backlog
// (outbox_relay_pending_rows, outbox_relay_lag_seconds) while one may exist.
const backlogEvery = 5 * time.Second

// backlogHint is what binlog mode knows of the backlog without a query. The
// backlog watch of a relay that tails the binlog counts only when it says a
// backlog may exist (countNeeded).
type backlogHint struct {
	held     atomic.Int64 // rows the pipeline read and has not acknowledged, at the acker's last look
	moved    atomic.Int64 // unix ns: the stream last resolved a transaction or a row (the acker took it)
	trouble  atomic.Int64 // unix ns: the stream's last failed attempt (a reconnect follows)
	sweeping atomic.Bool  // the due-time sweep knows of delayed rows
}

// reset starts a binlog pipeline's hints: nothing held, no trouble. (The
// due-time sweep keeps sweeping itself.)
func (h *backlogHint) reset() {
	h.held.Store(0)
	h.moved.Store(time.Now().UnixNano())
	h.trouble.Store(0)
}

// backlog is one count of the outbox table's backlog.
type backlog struct {
	rows int64   // rows not yet delivered, at most the count's limit
	due  bool    // one of them is due
	lag  float64 // seconds the oldest due one has been due; 0 when none is
}

// watchBacklog keeps outbox_relay_pending_rows and outbox_relay_lag_seconds
// for one leader term, in every mode and while paused: every backlogEvery it
// counts the backlog with readBacklog, unless countNeeded says the relay
// knows there is none. The function it returns ends the watch, waits for
// it, and sets both series to 0 (a standby reports no backlog); lead defers
// it.
func (r *Relay) watchBacklog(ctx context.Context) (stop func()) {
	m := r.cfg.Metrics
	if m == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.countBacklog(ctx, m)
	}()
	return func() {
		cancel()
		<-done
		m.SetPendingRows(0)
		m.SetLag(0)
	}
}

// countBacklog is watchBacklog's loop. A count that fails leaves
// pending_rows as it was and lets the lag grow from the last count: the
// rows then due cannot be assumed delivered.
func (r *Relay) countBacklog(ctx context.Context, m *metrics.Metrics) {
	t := time.NewTicker(backlogEvery)
	defer t.Stop()
	var (
		last   backlog
		lastAt time.Time
	)
	for {
		if r.countNeeded(last) {
			cctx, cancel := context.WithTimeout(ctx, backlogEvery)
			b, err := readBacklog(cctx, r.db, r.cfg.Table, metrics.PendingRowsCap)
			cancel()
			switch {
			case err == nil:
				last, lastAt = b, time.Now()
				m.SetPendingRows(b.rows)
				m.SetLag(b.lag)
			case ctx.Err() != nil:
				return
			default:
				if last.due {
					m.SetLag(last.lag + time.Since(lastAt).Seconds())
				}
				r.log.Debug("backlog not counted; outbox_relay_pending_rows and outbox_relay_lag_seconds not refreshed", zap.Error(err))
			}
		} else if last.rows > 0 || last.due {
			last = backlog{}
			m.SetPendingRows(0)
			m.SetLag(0)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// countNeeded reports whether a backlog may exist. It always may unless the
// relay tails the binlog (it polls, is paused, sweeps before tailing, or is
// between modes). While it tails, every pending row is one the pipeline
// holds, one the due-time sweep will deliver, or one the stream has not
// reached: so a count is needed while the pipeline holds rows, the sweep
// knows of delayed rows, the stream has failed since it last moved, or the
// last count found rows. Otherwise the count would find nothing, and an idle
// binlog relay sends no statement for it (docs/operations.md, "Quiet when
// idle").
func (r *Relay) countNeeded(last backlog) bool {
	if !r.Tailing() {
		return true
	}
	h := &r.backlog
	return last.rows > 0 || h.held.Load() > 0 || h.sweeping.Load() || h.trouble.Load() > h.moved.Load()
}

// readBacklog counts the rows of table not yet delivered (delivered_at NULL,
// the poller's "pending"; delayed ones included), at most limit, and how
// long the oldest due one has been due: an immediate row (available_at NULL)
// since its created_at, the oldest by id; a delayed row since its
// available_at (its created_at if later), the earliest. One statement of
// three reads of idx_due: the count reads at most limit index entries, each
// age one entry. The ages are reckoned by the database against its UTC
// clock.
func readBacklog(ctx context.Context, db *sql.DB, table string, limit int) (backlog, error) {
	quoted, err := outbox.QuoteTable(table)
	if err != nil {
		return backlog{}, fmt.Errorf("count the backlog: %w", err)
	}
	from := quoted + " FORCE INDEX (idx_due) WHERE delivered_at IS NULL"
	immediate := "(SELECT created_at FROM " + from + " AND available_at IS NULL ORDER BY id LIMIT 1)"
	delayed := "(SELECT GREATEST(created_at, available_at) FROM " + from +
		" AND available_at <= UTC_TIMESTAMP(6) ORDER BY available_at LIMIT 1)"
	age := func(since string) string { return "TIMESTAMPDIFF(MICROSECOND, " + since + ", UTC_TIMESTAMP(6))" }
	q := "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM " + from + " LIMIT " + strconv.Itoa(limit) + ") AS p), " +
		age(immediate) + ", " + age(delayed)
	var (
		b    backlog
		ages [2]sql.NullInt64 // NULL: no such row
	)
	if err := db.QueryRowContext(ctx, q).Scan(&b.rows, &ages[0], &ages[1]); err != nil {
		return backlog{}, fmt.Errorf("count the backlog of %s: %w", table, err)
	}
	for _, a := range ages {
		if a.Valid {
			b.due = true
			b.lag = max(b.lag, float64(a.Int64)/1e6)
		}
	}
	return b, nil
}
