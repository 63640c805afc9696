package relay

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
)

// sweepDelayed is the due-time sweep of binlog mode (docs/operations.md, "Delayed messages"): while
// delayed rows are known to exist (one probe at start, then whenever the
// stream skips one) it delivers those that are due, every poll interval. A
// relay without delayed rows runs no query here after the probe. It stops
// between rounds when stop closes; errors are logged and retried, except a
// fenced round or an expired lease, which end the leader term at once.
func (p *pipeline) sweepDelayed(ctx context.Context, stop <-chan struct{}) {
	s, interval, err := p.pub.DelayedSweeper()
	if err == nil {
		defer s.Close()
		p.runSweeper(ctx, stop, s, interval)
		return
	}
	p.r.log.Error("due-time sweep not started; delayed rows wait for the next handover", zap.Error(err))
}

func (p *pipeline) runSweeper(ctx context.Context, stop <-chan struct{}, s delayedSweeper, interval time.Duration) {
	log := p.r.log.Named("delayed")
	active, err := s.Pending(ctx)
	if err != nil {
		log.Warn("probe for delayed rows failed; sweeping to be safe", zap.Error(err))
		active = true
	}
	hint := &p.r.backlog.sweeping // delayed rows are a backlog the binlog does not show
	hint.Store(active)
	defer hint.Store(false)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-p.delayed:
			active = true
			hint.Store(true)
			continue
		case <-tick.C:
		}
		if !active {
			continue
		}
		n, err := s.Round(ctx)
		if err != nil {
			if errors.Is(err, checkpoint.ErrFenced) {
				p.leader.Lose(err) // a newer leader exists: end the term now
				return
			}
			if errors.Is(err, leadership.ErrLeaseExpired) {
				return // Valid has ended the term
			}
			if ctx.Err() != nil {
				return
			}
			log.Warn("due-time sweep round failed; retrying", zap.Error(err))
			continue
		}
		if n > 0 {
			log.Debug("delivered due delayed rows", zap.Int("rows", n))
			continue
		}
		if pending, err := s.Pending(ctx); err == nil && !pending {
			active = false
			hint.Store(false)
		}
	}
}
