package poller

import (
	"context"
	"database/sql"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/backoff"
)

// worker owns one publish channel and one database connection (session.go)
// and runs one round at a time on them.
type worker struct {
	p       *Poller
	id      int
	ch      Channel
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
