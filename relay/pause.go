package relay

import (
	"context"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// holdPaused keeps a paused relay's leadership and does nothing else until
// an operator resumes it (nil), leadership is lost (its error) or ctx ends
// (nil). The mode has already stopped and acknowledged everything it
// published, so the stored checkpoint is exactly where it stopped; the row
// records that this epoch has stopped (paused_epoch), which `pause` waits
// for and `checkpoint set` requires.
func (r *Relay) holdPaused(ctx context.Context, leader lease) error {
	r.tailing.Store(false)
	r.state.dropPublisher() // the publisher is closed while paused
	r.cfg.Metrics.SetMode("")
	r.paused.Store(true)
	defer r.paused.Store(false)
	if err := r.progress.MarkPaused(ctx, leader.Epoch()); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r.cfg.Metrics.SetPaused(true)
	defer r.cfg.Metrics.SetPaused(false)
	r.logCheckpoint(ctx, "paused by an operator: reading and publishing stopped, leadership kept; `outbox-relay resume` continues")
	since := time.Now()
	for {
		paused, changed := leader.Paused()
		if !paused {
			r.log.Info("resume seen", zap.Duration("paused_for", time.Since(since).Round(time.Millisecond)))
			return nil
		}
		select {
		case <-changed:
		case <-leader.Lost():
			return leader.Err()
		case <-ctx.Done():
			return nil
		}
	}
}

// logCheckpoint logs msg with the stored checkpoint, mode and why: at the
// start of a term, at a pause and at a resume. A checkpoint an operator set
// (`checkpoint set` stores the old and new positions as the mode reason) is
// logged at WARN, so the first run after it shows both.
func (r *Relay) logCheckpoint(ctx context.Context, msg string) {
	p, err := r.progress.Load(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn(msg+" (cannot read the checkpoint)", zap.Error(err))
		}
		return
	}
	log := r.log.Info
	if strings.HasPrefix(p.ModeReason, checkpoint.SetByOperator) {
		log = r.log.Warn
	}
	checkpointText := p.Position.String()
	if p.Position.IsZero() {
		checkpointText = "none yet (first start)"
	}
	log(msg, zap.String("checkpoint", checkpointText), zap.String("stored_mode", p.Mode),
		zap.String("mode_reason", p.ModeReason), zap.Int64("epoch", p.Epoch))
}
