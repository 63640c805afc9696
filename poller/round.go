package poller

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
)

// item is a claimed row and, after the flush, its Result.
type item struct {
	rec *outbox.Record
	res publish.Result
	bad string // why it could not be published; "" when it was
}

// onResult is the channel's callback. It writes the Result into the item
// the message was tagged with; the round reads it only after Flush, which
// returns after the callback did.
func (w *worker) onResult(r publish.Result) {
	if it, ok := r.Tag.(*item); ok {
		it.res = r
	}
}

// cursor is where the next round's candidate query starts in partition
// key order; shared by the workers of one Run or Drain, so that with many
// partitions they look at different ones and all get their turn.
//
// It also keeps the partitions the last listing saw, whose heads the next
// listing looks up directly (query.go, branch 6), unless they were a batch
// or more: the listing then finds enough partitions without them.
type cursor struct {
	mu    sync.Mutex
	key   string
	known []string
}

func (c *cursor) get() (key string, known []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.key, c.known
}

// set records a listing's cursor and partitions. It reports whether the
// listing found no partition the previous one had not seen (and fewer
// than max): the rounds then know every partition a listing shows, and
// a round over few of them may go deeper (round).
func (c *cursor) set(key string, known []string, max int) (settled bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.key = key
	if len(known) >= max {
		// The listing alone finds a batch of partitions: looking up
		// more would cost the database and add nothing.
		c.known = nil
		return false
	}
	slices.Sort(known)
	settled = len(c.known) > 0
	for _, k := range known {
		if _, ok := slices.BinarySearch(c.known, k); !ok {
			settled = false
			break
		}
	}
	c.known = known
	return settled
}

// candidates returns the ids a round may claim, oldest first, at most
// Batch*(Workers+1): enough that the rows other workers hold cannot use
// them all up. It reads from the shared cursor on, and from the start
// again if that finds nothing, so an empty result means no pending due row
// (up to maxID) at all.
func (w *worker) candidates(ctx context.Context, conn *sql.Conn, cur *cursor, maxID uint64) (ids []uint64, settled bool, err error) {
	p := w.p
	limit := p.cfg.Batch * (p.cfg.Workers + 1)
	for {
		from, known := cur.get()
		q, args := p.q.candidates(from, known, limit, maxID)
		cands, err := readCandidates(ctx, conn, q, args...)
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1176 {
			return nil, false, fmt.Errorf("find pending rows of %s: the table lacks an index the poller needs "+
				"(idx_head, idx_partition_id, idx_due of migrations/sql/0001_outbox.sql): %w", p.cfg.Table, err)
		}
		if err != nil {
			return nil, false, fmt.Errorf("find pending rows of %s: %w", p.cfg.Table, err)
		}
		ids, next, keys := heads(cands, limit)
		settled = cur.set(next, keys, p.cfg.Batch)
		if len(ids) > 0 || from == "" {
			return ids, settled, nil
		}
	}
}

// round runs one round on the worker's connection: find candidates (outside
// any transaction); if there are some, claim, publish, flush, acknowledge,
// fence and commit in one READ COMMITTED transaction. It returns how many
// rows it acknowledged and whether there were candidates at all. A failed
// round closes the connection (the next opens another).
func (w *worker) round(ctx context.Context, cur *cursor, maxID uint64) (acked int, found bool, err error) {
	p := w.p
	t0 := time.Now()
	defer func() {
		if err != nil {
			w.endSession() // after the transaction's rollback (deferred below)
		}
	}()
	conn, err := w.session(ctx)
	if err != nil {
		return 0, false, err
	}
	ids, settled, err := w.candidates(ctx, conn, cur, maxID)
	if err != nil {
		return 0, false, err
	}
	if len(ids) == 0 {
		return 0, false, nil
	}

	// The transaction outlives ctx so that a round whose messages are all
	// confirmed can still commit at shutdown; its statements take ctx (or
	// the bounded finish context), and cancelling one breaks the
	// connection, which rolls the transaction back.
	tx, err := conn.BeginTx(context.WithoutCancel(ctx), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, true, fmt.Errorf("begin poll transaction: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()

	recs, err := w.claimRows(ctx, tx, ids, settled, maxID)
	if err != nil || len(recs) == 0 {
		return 0, true, err // none: every candidate is held by someone else
	}

	// Claimed, nothing published yet: a leader whose lease has expired
	// meanwhile rolls the round back.
	if err := p.checkLeading(len(recs)); err != nil {
		return 0, true, err
	}
	t1 := time.Now()
	fl := startInflight(p.cfg.Metrics, recs)
	defer fl.end()
	items, err := w.publish(ctx, recs)
	fl.answered()
	if err != nil {
		return 0, true, err
	}
	t2 := time.Now()

	failed := outcome(items)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	if err := p.ack(fctx, tx, recs, failed); err != nil {
		return 0, true, afterPublish(confirmed(items), err)
	}
	if err := fence(fctx, tx, p.relayName, p.epoch); err != nil {
		return 0, true, afterPublish(confirmed(items), err)
	}
	if err := tx.Commit(); err != nil {
		return 0, true, afterPublish(confirmed(items), fmt.Errorf("commit poll round of %d rows: %w", len(recs), err))
	}
	committed = true
	p.recordLastEvent(fctx, w.log, recs)
	p.observe(items, true, len(failed))
	w.commits.done()
	logFailed(w.log, items)
	t3 := time.Now()
	w.log.Debug("poll round committed", zap.Int("rows", len(recs)), zap.Int("partitions", partitions(recs)), zap.Int("failed", len(failed)),
		zap.Duration("claim", t1.Sub(t0)), zap.Duration("publish", t2.Sub(t1)), zap.Duration("ack", t3.Sub(t2)))
	return len(recs), true, nil
}

// checkLeading asks cfg.Leading, between a round's claim of n rows and its
// first publish, whether this process may still publish; an error wrapping
// leadership.ErrLeaseExpired when not (the caller rolls the round back).
func (p *Poller) checkLeading(n int) error {
	if p.cfg.Leading == nil || p.cfg.Leading() {
		return nil
	}
	return fmt.Errorf("poll round of %d claimed rows rolled back unpublished: no longer leading: %w", n, leadership.ErrLeaseExpired)
}

// publish sends recs in order on the worker's channel and waits until every
// one has its Result. A row FromRecord or Publish refuses is not sent and
// gets bad set instead. An error means the round must be abandoned: ctx
// ended or the publisher is closed; Results are unknown then, and the error
// says how many messages were sent (published).
func (w *worker) publish(ctx context.Context, recs []*outbox.Record) ([]*item, error) {
	p := w.p
	items := make([]*item, len(recs))
	sent := 0
	for i, rec := range recs {
		it := &item{rec: rec}
		items[i] = it
		m, err := publish.FromRecord(rec, p.cfg.DefaultExchange, p.epoch, false)
		if err == nil {
			m.Tag = it
			m.Size = rec.Size()
			err = w.ch.Publish(ctx, m)
		}
		var bad *publish.BadRecordError
		switch {
		case errors.As(err, &bad):
			it.bad = bad.Reason
		case err != nil:
			return nil, afterPublish(sent, fmt.Errorf("publish row %d: %w", rec.ID, err))
		default:
			sent++
		}
	}
	if err := w.ch.Flush(ctx); err != nil {
		return nil, afterPublish(sent, fmt.Errorf("wait for the broker's confirms of %d rows: %w", len(recs), err))
	}
	return items, nil
}

// publishedError is the error of a round abandoned after it had published
// messages: their rows stay pending, so they will be published again.
type publishedError struct {
	messages int
	err      error
}

func (e *publishedError) Error() string { return e.err.Error() }

func (e *publishedError) Unwrap() error { return e.err }

// afterPublish wraps err, the error of a round that had published n
// messages, so that published tells n.
func afterPublish(n int, err error) error {
	if n == 0 {
		return err
	}
	return &publishedError{messages: n, err: err}
}

// published is how many messages the round that failed with err had
// published: 0 when none, or err is nil.
func published(err error) int {
	var pe *publishedError
	if errors.As(err, &pe) {
		return pe.messages
	}
	return 0
}

// confirmed is how many of a flushed round's messages the broker confirmed
// (the ones on a queue: returned or rejected ones are not).
func confirmed(items []*item) int {
	n := 0
	for _, it := range items {
		if it.bad == "" && it.res.Outcome == publish.Confirmed {
			n++
		}
	}
	return n
}

// observe feeds a round's outcomes to the metrics.
func (p *Poller) observe(items []*item, committed bool, failed int) {
	m := p.cfg.Metrics
	if m == nil {
		return
	}
	now := time.Now()
	for _, it := range items {
		switch {
		case it.bad != "":
			m.PublishFailed(metrics.ReasonBadRecord)
		case it.res.Outcome == publish.Confirmed:
			m.Delivered(it.rec.CreatedAt, now)
		case it.res.Outcome == publish.Rejected:
			m.PublishFailed(metrics.ReasonNacked)
		default:
			m.PublishFailed(metrics.ReturnReason(it.res.Code))
		}
	}
	if committed {
		m.MessagesFailed(failed)
	}
}

// recordLastEvent moves the progress row's last_event_at to the newest
// created_at of a committed round's rows; a failure is logged, not
// returned: the rows are acknowledged, only the status column lags.
func (p *Poller) recordLastEvent(ctx context.Context, log *zap.Logger, recs []*outbox.Record) {
	var newest time.Time
	for _, r := range recs {
		if r.CreatedAt.After(newest) {
			newest = r.CreatedAt
		}
	}
	if err := p.store.RecordLastEvent(ctx, p.epoch, newest); err != nil {
		log.Warn("last_event_at not updated", zap.Error(err))
	}
}

// outcome returns the rows of a flushed round that go to outbox_failed,
// with their reason: rows that could not be published as they are, and
// rows the broker returned or rejected.
func outcome(items []*item) []ordering.Failure {
	var failed []ordering.Failure
	for _, it := range items {
		switch {
		case it.bad != "":
			failed = append(failed, ordering.Failure{Record: it.rec, Reason: badRecordReason(it.bad)})
		case it.res.Outcome != publish.Confirmed:
			failed = append(failed, ordering.Failure{Record: it.rec, Reason: it.res.Reason})
		}
	}
	return failed
}

// ack acknowledges a round's rows in tx with store.AckRows: the failed
// ones copied to outbox_failed, then every row deleted (or marked
// delivered) by primary key point lookups, which lock only this round's
// rows (AckRows says why that needs care).
func (p *Poller) ack(ctx context.Context, tx *sql.Tx, recs []*outbox.Record, failed []ordering.Failure) error {
	ids := make([]uint64, len(recs))
	mids := make([]outbox.MessageID, len(recs))
	for i, r := range recs {
		ids[i], mids[i] = r.ID, r.MessageID
	}
	return p.store.AckRows(ctx, tx, ordering.RangesOf(ids), mids, failed)
}
