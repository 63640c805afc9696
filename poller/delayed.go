package poller

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/sqltime"
)

// DelayedSweeper is the due-time sweep of binlog mode (docs/operations.md, "Delayed messages"). The
// binlog stream publishes only rows whose available_at is NULL and leaves
// every row with available_at set to the sweeper, so the two never publish
// the same row. A sweep round is a poll round limited to those rows once
// they are due: claim (FOR UPDATE SKIP LOCKED, oldest first), publish on the
// sweeper's own channel, wait for every confirm, acknowledge, fence, commit.
// Delayed rows do not hold back their partition, and among themselves go
// out oldest first.
type DelayedSweeper struct {
	w *worker
}

// NewDelayedSweeper returns a sweeper with its own AMQP channel.
func (p *Poller) NewDelayedSweeper() (*DelayedSweeper, error) {
	w := &worker{p: p, id: -1, cur: &cursor{}, commits: newCommits(), found: newCommits(), log: p.log.With(zap.String("worker", "delayed"))}
	ch, err := p.pub.NewChannel(w.onResult)
	if err != nil {
		return nil, fmt.Errorf("delayed-row sweeper: %w", err)
	}
	w.ch = ch
	return &DelayedSweeper{w: w}, nil
}

// Close closes the sweeper's channel and its database connection (which
// Round opens, with a poll lock, and keeps between rounds). Not at once with
// Round.
func (s *DelayedSweeper) Close() error {
	s.w.endSession()
	return s.w.ch.Close()
}

// Earliest returns the earliest available_at among the pending delayed rows,
// due or not (the zero time when there is none), and the server's UTC clock
// when it looked: one statement that reads one entry of idx_due. The relay
// sleeps until the earliest is due, reckoned on the server's clock, which
// is the one Round compares available_at with.
func (s *DelayedSweeper) Earliest(ctx context.Context) (earliest, serverNow time.Time, err error) {
	p := s.w.p
	var at, now sqltime.UTC
	err = p.db.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(6), (SELECT available_at FROM "+p.q.table+" FORCE INDEX (idx_due)"+
		" WHERE delivered_at IS NULL AND available_at IS NOT NULL ORDER BY available_at LIMIT 1)").Scan(&now, &at)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("look for the earliest delayed row in %s: %w", p.cfg.Table, err)
	}
	return at.T, now.T, nil
}

// Round delivers up to Batch due delayed rows and returns how many.
// At-least-once like every round: if it fails after publishing, the rows
// stay pending and are published again. Like a poll round it asks
// Config.Leading after its claim: an error wrapping
// leadership.ErrLeaseExpired, nothing published, when it says no. It runs
// on the sweeper's own connection (a worker's, session.go), which a failed
// round closes.
func (s *DelayedSweeper) Round(ctx context.Context) (n int, err error) {
	w, p := s.w, s.w.p
	defer func() {
		if err != nil {
			w.endSession() // after the transaction's rollback (deferred below)
		}
	}()
	conn, err := w.session(ctx)
	if err != nil {
		return 0, err
	}
	tx, err := conn.BeginTx(context.WithoutCancel(ctx), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("begin delayed-row sweep: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	recs, err := readRecords(ctx, tx, "SELECT "+RecordColumns+" FROM "+p.q.table+" FORCE INDEX (idx_due)"+
		" WHERE delivered_at IS NULL AND available_at IS NOT NULL AND available_at <= UTC_TIMESTAMP(6)"+
		" ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED", p.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("claim due delayed rows in %s: %w", p.cfg.Table, err)
	}
	if len(recs) == 0 {
		return 0, nil
	}
	if err := p.checkLeading(len(recs)); err != nil {
		return 0, err
	}
	fl := startInflight(p.cfg.Metrics, recs)
	defer fl.end()
	items, err := w.publish(ctx, recs)
	fl.answered()
	if err != nil {
		return 0, err
	}
	failed := outcome(items)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	if err := p.ack(fctx, tx, recs, failed); err != nil {
		return 0, err
	}
	if err := fence(fctx, tx, p.relayName, p.epoch); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("commit delayed-row sweep of %d rows: %w", len(recs), err)
	}
	committed = true
	p.observe(items, true, len(failed))
	logFailed(w.log, items)
	return len(recs), nil
}
