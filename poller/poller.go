package poller

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
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
	pub       Publisher
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
func New(db *sql.DB, pub Publisher, store *checkpoint.Store, epoch int64, cfg Config) (*Poller, error) {
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
