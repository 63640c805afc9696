package poller

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/backoff"
	"github.com/outbox-relay/outbox-relay/metrics"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
)

// finishTimeout bounds the acknowledgement and commit of a round whose
// messages all have their Result when the caller's context ends: the round
// is finished rather than thrown away (which would publish it again), but
// a stuck database does not hold shutdown up for longer than this.
const finishTimeout = 10 * time.Second

// maxBackoff bounds the wait between Run's retries after a failed round.
const maxBackoff = 5 * time.Second

// Poller delivers pending outbox rows by polling (docs/operations.md, "Modes"). It holds no
// mutable state of its own: Run and Drain may be called any number of
// times, even at once, and each call owns the workers it starts.
type Poller struct {
	db        *sql.DB
	pub       *publish.Publisher
	store     *checkpoint.Store
	relayName string
	epoch     int64
	cfg       Config
	q         queries
	log       *zap.Logger
}

// New returns a poller that claims rows through db, publishes them on
// channels of pub with x-relay-epoch epoch, and acknowledges them with
// store.AckRows fenced by epoch. cfg.Table and cfg.OnDelivered must agree
// with the store's configuration (it deletes or marks the rows); empty
// ones are taken from it.
//
// db needs no particular session settings: times are compared with
// UTC_TIMESTAMP(6) and scanned as UTC with or without parseTime. Each worker
// holds a connection of its own for the length of its call (Run, Drain; a
// DelayedSweeper until Close), marked with one of the relay name's poll
// locks (session.go), so the pool must allow cfg.Workers open connections
// besides what the rest of the relay needs, or the workers wait for each
// other's.
func New(db *sql.DB, pub *publish.Publisher, store *checkpoint.Store, epoch int64, cfg Config) (*Poller, error) {
	if db == nil || pub == nil || store == nil {
		return nil, errors.New("poller: New needs a database, a publisher and a checkpoint store")
	}
	sc := store.Config()
	if cfg.Table == "" {
		cfg.Table = sc.Table
	}
	if cfg.OnDelivered == "" {
		cfg.OnDelivered = sc.OnDelivered
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Table != sc.Table || cfg.OnDelivered != sc.OnDelivered {
		return nil, fmt.Errorf("poller config: table %q on-delivered %q, but the checkpoint store acknowledges table %q with %q",
			cfg.Table, cfg.OnDelivered, sc.Table, sc.OnDelivered)
	}
	return &Poller{
		db: db, pub: pub, store: store, relayName: sc.RelayName, epoch: epoch, cfg: cfg,
		q:   queries{table: "`" + cfg.Table + "`", mark: cfg.OnDelivered == checkpoint.Mark},
		log: cfg.Logger.With(zap.String("table", cfg.Table), zap.Int64("epoch", epoch)),
	}, nil
}

// Config returns the validated configuration.
func (p *Poller) Config() Config { return p.cfg }

// ErrStopped is DrainUntil's error when its stop channel closed before every
// pending row was delivered: the rounds under way committed, the rest is
// still pending.
var ErrStopped = errors.New("poller: drain stopped before every pending row was delivered")

// CutError reports rounds that ctx's end rolled back after they had
// published messages: the broker has those Messages, their rows are still
// pending, so they will be published again (at-least-once). It wraps ctx's
// error: errors.Is(err, context.Canceled) holds for a cancelled ctx.
type CutError struct {
	Rounds   int // rounds rolled back after publishing
	Messages int // messages those rounds had published
	Err      error
}

func (e *CutError) Error() string {
	return fmt.Sprintf("%d poll rounds rolled back after publishing %d messages, which will be published again: %v",
		e.Rounds, e.Messages, e.Err)
}

func (e *CutError) Unwrap() error { return e.Err }

// Run polls with cfg.Workers workers until ctx ends, and returns nil then
// (a *CutError when ctx's end rolled back rounds that had published), or
// the first fatal error, after stopping every worker: checkpoint.ErrFenced
// (wrapped; match with errors.Is) when the progress row moved to a newer
// epoch — leadership is lost and nothing more was acknowledged —,
// leadership.ErrLeaseExpired (wrapped) when cfg.Leading said no after a
// round's claim — that round published nothing —, or an error no retry can
// fix (missing table, column or index, access denied, the publisher
// closed). Other failures (database or broker unreachable,
// deadlock) abandon the round, are logged, and the worker retries with
// backoff. On ctx end a worker finishes its round if every message of it has
// its Result, else rolls it back (those rows are published again later:
// at-least-once).
func (p *Poller) Run(ctx context.Context) error { return p.RunUntil(ctx, nil) }

// RunUntil is Run that also ends, gracefully, when stop is closed: no worker
// starts another round, and the rounds under way run to their commit (their
// context is still ctx). Nothing they published is published again, which
// makes the poll → binlog handover exact. A nil stop never closes. Ending
// ctx as well (a deadline after stop) rolls back the rounds still under way.
func (p *Poller) RunUntil(ctx context.Context, stop <-chan struct{}) error {
	t, err := p.workers(ctx, func(ctx context.Context, w *worker) (int, error) { return w.run(ctx, stop) })
	if ctx.Err() != nil && (err == nil || errors.Is(err, ctx.Err())) {
		return t.cutError(ctx.Err())
	}
	return err
}

// Drain delivers every pending, due row as Run would, with cfg.Workers
// workers, and returns how many rows it took out of the pending set
// (published and acknowledged, including rows moved to outbox_failed).
// It considers the rows up to the largest id present when it starts: rows
// inserted after that may be delivered too but are not waited for, so a
// drain ends under a steady stream of new rows. A worker stops when its
// candidate query finds no pending due row left; while candidates exist but
// other transactions hold them, it looks again when another worker commits
// (at the latest after cfg.Interval), so a row someone else holds is not
// silently left behind. Delayed rows
// (available_at in the future) are left pending.
//
// Unlike Run, Drain retries only lock conflicts (deadlock, lock wait
// timeout); it gives up on any other error (ctx's included) and returns it
// with the count so far. Rows of an abandoned round stay pending; when
// ctx's end rolled back rounds that had published, the error is a
// *CutError saying how many messages will be published again.
// Used for the poll → binlog handover (docs/operations.md, "Modes") and the first start.
func (p *Poller) Drain(ctx context.Context) (int, error) { return p.DrainUntil(ctx, nil) }

// DrainUntil is Drain that also ends, gracefully, when stop is closed: no
// worker starts another round, the rounds under way run to their commit
// (their context is still ctx), and it returns ErrStopped with the count
// unless every pending row was delivered by then. Nothing those rounds
// published is published again. Ending ctx as well (a deadline after stop)
// rolls back the rounds still under way. A nil stop never closes.
func (p *Poller) DrainUntil(ctx context.Context, stop <-chan struct{}) (int, error) {
	var maxID uint64
	if err := p.db.QueryRowContext(ctx, p.q.maxID()).Scan(&maxID); err != nil {
		return 0, fmt.Errorf("drain %s: read the largest id: %w", p.cfg.Table, err)
	}
	if maxID == 0 {
		return 0, nil
	}
	var stopped atomic.Bool
	t, err := p.workers(ctx, func(ctx context.Context, w *worker) (int, error) {
		n, early, err := w.drain(ctx, stop, maxID)
		if early {
			stopped.Store(true)
		}
		return n, err
	})
	switch {
	case ctx.Err() != nil && t.cutMessages > 0:
		return t.rows, t.cutError(ctx.Err())
	case err != nil:
		return t.rows, err
	case stopped.Load():
		return t.rows, ErrStopped
	}
	return t.rows, nil
}

// tally is what the workers of one Run or Drain did.
type tally struct {
	rows                   int // rows acknowledged
	cutRounds, cutMessages int // rounds ctx's end rolled back after publishing, and their messages
}

// cutError is nil when no round was cut after publishing, else a *CutError
// wrapping err (ctx's error).
func (t tally) cutError(err error) error {
	if t.cutMessages == 0 {
		return nil
	}
	return &CutError{Rounds: t.cutRounds, Messages: t.cutMessages, Err: err}
}

// workers runs body on cfg.Workers workers, each with its own publish
// channel, until all return; the first error cancels the others and is
// returned with the sum of their counts.
func (p *Poller) workers(ctx context.Context, body func(context.Context, *worker) (int, error)) (tally, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		t        tally
		firstErr error
		cur      cursor
		commits  = newCommits()
		found    = newCommits()
	)
	for i := range p.cfg.Workers {
		w := &worker{p: p, id: i, cur: &cur, commits: commits, found: found, log: p.log.With(zap.Int("worker", i))}
		ch, err := p.pub.NewChannel(w.onResult)
		if err != nil {
			cancel()
			wg.Wait()
			return t, fmt.Errorf("poller worker %d: %w", i, err)
		}
		w.ch = ch
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer ch.Close()
			defer w.endSession()
			n, err := body(ctx, w)
			mu.Lock()
			defer mu.Unlock()
			t.rows += n
			t.cutRounds += w.cutRounds
			t.cutMessages += w.cutMessages
			if err != nil && firstErr == nil {
				firstErr = err
				cancel()
			}
		}()
	}
	wg.Wait()
	return t, firstErr
}

// worker owns one publish channel and one database connection (session.go)
// and runs one round at a time on them.
type worker struct {
	p       *Poller
	id      int
	ch      *publish.Channel
	conn    *sql.Conn // holds a poll lock; nil until the first round and after a failed one
	used    time.Time // when conn was last handed to a round
	cur     *cursor   // shared with the call's other workers
	commits *commits  // shared with the call's other workers
	found   *commits  // shared with the call's other workers: closed when a round finds rows
	log     *zap.Logger

	// Rounds ctx's end rolled back after they had published, and their
	// messages (which will be published again).
	cutRounds, cutMessages int
}

// noteCut counts the round that failed with err as cut when it had
// published messages; called when ctx has ended.
func (w *worker) noteCut(err error) {
	if n := published(err); n > 0 {
		w.cutRounds++
		w.cutMessages += n
	}
}

// untilStop returns ctx also ended when stop closes: it bounds the waits
// between rounds, never a round itself.
func untilStop(ctx context.Context, stop <-chan struct{}) (context.Context, context.CancelFunc) {
	idle, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-stop:
			cancel()
		case <-idle.Done():
		}
	}()
	return idle, cancel
}

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

// run is one Run worker: rounds until ctx ends, stop closes (between
// rounds; a round under way still commits) or a fatal error.
func (w *worker) run(ctx context.Context, stop <-chan struct{}) (int, error) {
	idle, cancelIdle := untilStop(ctx, stop)
	defer cancelIdle()
	total, failures := 0, 0
	for {
		if idle.Err() != nil {
			return total, nil
		}
		commit, found := w.commits.next(), w.found.next()
		n, ok, err := w.round(ctx, w.cur, 0)
		total += n
		if ok {
			w.found.done()
		}
		if ctx.Err() != nil {
			w.noteCut(err)
			return total, nil
		}
		switch {
		case err != nil && fatal(err):
			return total, err
		case err != nil:
			failures++
			wait := backoff.Delay(w.p.cfg.Interval, maxBackoff, failures)
			w.log.Warn("poll round failed; retrying", zap.Error(err), zap.Int("failures", failures),
				zap.Int("published_again", published(err)), zap.Duration("retry_in", wait))
			if !backoff.Sleep(idle, wait) {
				return total, nil
			}
		case !ok && w.id != 0:
			// Nothing pending: worker 0 alone polls; this one waits
			// until a round of any worker finds rows.
			failures = 0
			select {
			case <-idle.Done():
				return total, nil
			case <-found:
			}
		case !ok:
			failures = 0
			if !backoff.Sleep(idle, w.p.cfg.Interval) {
				return total, nil
			}
		case n == 0:
			// Everything due is held by other workers: go again when one
			// of them commits (at the latest after an interval).
			failures = 0
			if !waitCommit(idle, commit, w.p.cfg.Interval) {
				return total, nil
			}
		default:
			failures = 0
		}
	}
}

// drain is one Drain worker: rounds until no pending due row up to maxID is
// left, an error, or stop closes (between rounds: early is true then).
func (w *worker) drain(ctx context.Context, stop <-chan struct{}, maxID uint64) (total int, early bool, err error) {
	idle, cancelIdle := untilStop(ctx, stop)
	defer cancelIdle()
	// interrupted is the result when a wait between rounds was cut short.
	interrupted := func() (int, bool, error) {
		if ctx.Err() != nil {
			return total, false, ctx.Err()
		}
		return total, true, nil
	}
	conflicts := 0
	for {
		if idle.Err() != nil {
			return interrupted()
		}
		commit := w.commits.next()
		n, found, err := w.round(ctx, w.cur, maxID)
		total += n
		if err != nil && lockConflict(err) && ctx.Err() == nil {
			conflicts++
			w.log.Info("drain round hit a lock conflict; retrying", zap.Error(err))
			if !backoff.Sleep(idle, backoff.Delay(w.p.cfg.Interval, maxBackoff, conflicts)) {
				return interrupted()
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				w.noteCut(err)
			}
			return total, false, err
		}
		conflicts = 0
		if !found {
			return total, false, nil
		}
		if n == 0 && !waitCommit(idle, commit, w.p.cfg.Interval) {
			return interrupted()
		}
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

// commits lets the workers of one Run or Drain wait for each other: a
// worker whose candidates were all held by other workers waits until one of
// them commits (which frees those partitions) rather than a whole interval.
type commits struct {
	mu sync.Mutex
	ch chan struct{} // closed and replaced at every commit
}

func newCommits() *commits { return &commits{ch: make(chan struct{})} }

// next returns a channel closed at the next commit after the call.
func (c *commits) next() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch
}

func (c *commits) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.ch)
	c.ch = make(chan struct{})
}

// waitCommit waits until commit is closed, d has passed or ctx ends; false
// when ctx ended.
func waitCommit(ctx context.Context, commit <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-commit:
		return true
	case <-t.C:
		return true
	}
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

// Deep rounds: a round over fewer than Batch/deepRounds partitions takes
// up to deepRounds*Batch rows, when the listings have settled (the last
// one found no partition new to them, so few partitions means few in the
// backlog, not few seen yet). A few partitions' rows go out one confirm
// after another per partition; a deeper round spends its claim and commit
// (during which no message of those partitions is on the wire) on up to
// deepRounds times as many. Past its first Batch rows it takes another
// Batch only while that many, at the average size of the rows it holds,
// keep it within deepBytes.
const (
	deepRounds = 4
	deepBytes  = 16 << 20
)

// depth is how many rows a round over heads may hold in all.
func (w *worker) depth(heads []*outbox.Record, settled bool) int {
	if batch := w.p.cfg.Batch; !settled || len(heads)*deepRounds >= batch {
		return batch
	}
	return deepRounds * w.p.cfg.Batch
}

// claimRows locks the round's rows in tx: up to Batch of the candidate
// ids (the partitions' heads, oldest first), then as many of their
// partitions' following rows as the round's depth leaves room for. The
// rows come back in id order; none when another transaction holds every
// candidate.
func (w *worker) claimRows(ctx context.Context, tx *sql.Tx, ids []uint64, settled bool, maxID uint64) ([]*outbox.Record, error) {
	p := w.p
	recs, err := claim(ctx, tx, p.q, ids, p.cfg.Batch)
	if err != nil {
		return nil, fmt.Errorf("claim partition heads in %s: %w", p.cfg.Table, err)
	}
	var heads []*outbox.Record
	for _, r := range recs {
		if r.PartitionKey != "" {
			heads = append(heads, r)
		}
	}
	depth := w.depth(heads, settled)
	if room := depth - len(recs); room > 0 && len(heads) > 0 {
		// One index dive per listed head: with more heads than room
		// (a round over many short partitions), the oldest room heads
		// give a follower each at most; the others' followers become
		// heads of a later round.
		named := heads[:min(len(heads), room)]
		lock := lockAll
		if depth > p.cfg.Batch {
			lock = w.lockWithin(recs)
		}
		more, err := followers(ctx, tx, p.q, named, room, maxID, lock)
		if err != nil {
			return nil, fmt.Errorf("claim the following rows of %d partitions in %s: %w", len(named), p.cfg.Table, err)
		}
		recs = append(recs, more...)
	}
	slices.SortFunc(recs, func(a, b *outbox.Record) int { return cmp.Compare(a.ID, b.ID) })
	return recs, nil
}

// locker locks the listed ids (sorted) of a round's followers, oldest
// first, and returns the rows it locked; it may stop before the last id:
// the rows it did not lock are a gap the round's partitions end at.
type locker func(ctx context.Context, tx *sql.Tx, q queries, ids []uint64) ([]*outbox.Record, error)

// lockAll locks every listed id.
func lockAll(ctx context.Context, tx *sql.Tx, q queries, ids []uint64) ([]*outbox.Record, error) {
	return claim(ctx, tx, q, ids, len(ids))
}

// lockWithin is a deep round's locker: the ids that fill the round (held,
// its heads) to a batch, then a batch of ids at a time while the round,
// at the average size of the rows it holds, stays within deepBytes.
func (w *worker) lockWithin(held []*outbox.Record) locker {
	batch := w.p.cfg.Batch
	return func(ctx context.Context, tx *sql.Tx, q queries, ids []uint64) ([]*outbox.Record, error) {
		n, size := len(held), 0
		for _, r := range held {
			size += r.Size()
		}
		var locked []*outbox.Record
		for step := max(batch-n, 1); len(ids) > 0; step = batch {
			if n >= batch && size/n > (deepBytes-size)/batch {
				break
			}
			chunk := ids[:min(len(ids), step)]
			ids = ids[len(chunk):]
			got, err := claim(ctx, tx, q, chunk, len(chunk))
			if err != nil {
				return nil, err
			}
			for _, r := range got {
				size += r.Size()
			}
			n += len(got)
			locked = append(locked, got...)
		}
		return locked, nil
	}
}

// partitions is how many distinct non-empty partition keys recs have.
func partitions(recs []*outbox.Record) int {
	keys := map[string]bool{}
	for _, r := range recs {
		if r.PartitionKey != "" {
			keys[r.PartitionKey] = true
		}
	}
	return len(keys)
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

// claim locks up to limit of ids (sorted) that are pending, due and not
// held by another transaction, oldest first, by primary key.
func claim(ctx context.Context, tx *sql.Tx, q queries, ids []uint64, limit int) ([]*outbox.Record, error) {
	var recs []*outbox.Record
	for len(ids) > 0 && len(recs) < limit {
		chunk := ids[:min(len(ids), maxClaimIDs)]
		ids = ids[len(chunk):]
		got, err := readRecords(ctx, tx, q.claim(chunk, limit-len(recs)))
		if err != nil {
			return nil, err
		}
		recs = append(recs, got...)
	}
	return recs, nil
}

// followers claims up to limit pending due rows that follow the heads in
// their partitions: it lists them without locks, locks them by primary key
// with lock, and keeps of each partition the rows up to the first one it
// could not lock (or lock left unlocked), so a partition's rows go out
// without a gap. (No other round can hold a row of a partition whose head
// this round holds, so a gap means a foreign lock or lock's stop; the rows
// after it that were locked stay locked, unpublished, until commit, and a
// later round takes them.)
func followers(ctx context.Context, tx *sql.Tx, q queries, heads []*outbox.Record, limit int, maxID uint64, lock locker) ([]*outbox.Record, error) {
	query, args := q.followers(heads, limit, maxID)
	listed, err := readCandidates(ctx, tx, query, args...)
	if err != nil || len(listed) == 0 {
		return nil, err
	}
	ids := make([]uint64, len(listed))
	for i, c := range listed {
		ids[i] = c.id
	}
	slices.Sort(ids)
	locked, err := lock(ctx, tx, q, ids)
	if err != nil {
		return nil, err
	}
	byID := make(map[uint64]*outbox.Record, len(locked))
	for _, r := range locked {
		byID[r.ID] = r
	}
	var (
		out []*outbox.Record
		cut = map[string]bool{}
	)
	slices.SortFunc(listed, func(a, b candidate) int { return cmp.Compare(a.id, b.id) })
	for _, c := range listed { // per partition in id order
		r := byID[c.id]
		if r == nil || cut[c.key] {
			cut[c.key] = true
			continue
		}
		out = append(out, r)
	}
	return out, nil
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

// fatal reports whether retrying cannot help: leadership lost (fenced, or
// the lease expired), the publisher closed, or the schema or grants are
// wrong.
func fatal(err error) bool {
	if errors.Is(err, checkpoint.ErrFenced) || errors.Is(err, leadership.ErrLeaseExpired) || errors.Is(err, publish.ErrClosed) {
		return true
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1044, 1045, 1142, 1143, // access denied (database, user, table, column)
			1046, 1049, // no database selected, unknown database
			1054, 1146, // unknown column, unknown table
			1176: // FORCE INDEX names an index the table lacks: run migrate
			return true
		}
	}
	return false
}

// lockConflict reports a deadlock or lock wait timeout: the round was
// rolled back and can simply run again.
func lockConflict(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}
