package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/backoff"
	"github.com/outbox-relay/outbox-relay/ordering"
)

// headroomEvery is how often the leader computes
// outbox_relay_binlog_retention_headroom_seconds (three statements): binlog
// retention is hours or days, so the figure moves slowly.
const headroomEvery = 10 * time.Minute

// ackGap is the least time between two acknowledgements while rows keep
// arriving (the first after a quiet spell goes at once).
const ackGap = 50 * time.Millisecond

// acker acknowledges the low watermark: soon after rows are ready, and
// now and then when only foreign transactions moved it (so the stored
// position is not purged from under us). On stop it acknowledges what is
// ready one last time.
func (p *pipeline) acker(ctx context.Context, stop <-chan struct{}) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	retry := backoff.Counter{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	var last time.Time
	p.r.backlog.reset()
	for {
		final := false
		select {
		case <-p.tracker.Changed():
			// Coalesce: acknowledging every confirm on its own would cost
			// the database a transaction per message, as many as the
			// producers' own commits. At most one per ackGap; a crash
			// repeats at most that much more.
			if wait := ackGap - time.Since(last); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-stop:
					final = true
				case <-ctx.Done():
					t.Stop()
					return nil
				}
				t.Stop()
			}
		case <-tick.C:
		case <-stop:
			final = true
		case <-ctx.Done():
			return nil
		}
		last = time.Now()
		err := p.flushAck(ctx, final)
		p.observe(ctx)
		switch {
		case err == nil:
			retry.Reset()
		case errors.Is(err, checkpoint.ErrFenced):
			// A newer leader exists: end the term now (reading and
			// publishing stop through leader.Lost) rather than at the
			// next heartbeat.
			p.leader.Lose(err)
			return err
		case final:
			return fmt.Errorf("final acknowledgement: %w", err)
		default:
			d := retry.Next()
			p.r.log.Warn("acknowledgement failed, retrying", zap.Error(err), zap.Duration("in", d))
			if !backoff.Sleep(ctx, d) {
				return nil
			}
		}
		if final {
			return nil
		}
	}
}

// flushAck takes what the tracker has resolved and acknowledges it, together
// with anything an earlier failed attempt left. Rows are acknowledged at once;
// a position-only move waits for CheckpointInterval unless force is set. When
// it returns nil, everything taken so far is acknowledged or deferred only
// by that interval, and the budget the acknowledged rows held is released:
// while acknowledgements fail the budget stays spent and reading stops.
func (p *pipeline) flushAck(ctx context.Context, force bool) error {
	p.ackMu.Lock()
	defer p.ackMu.Unlock()
	if b, ok := p.tracker.Take(); ok {
		p.pendingAck.Merge(b)
		p.r.backlog.moved.Store(time.Now().UnixNano())
	}
	b := &p.pendingAck
	hasRows := len(b.IDs) > 0 || len(b.Failed) > 0
	if !hasRows && (!b.HasPos || !force && time.Since(p.lastAck) < p.r.cfg.CheckpointInterval) {
		return nil
	}
	ack := checkpoint.Ack{
		Pos: b.Pos.Position, HasPos: b.HasPos && !b.Pos.IsZero(), Mode: string(p.ackMode(b.Pos)),
		IDs: b.IDs, MessageIDs: b.MessageIDs, Failed: b.Failed, LastEventAt: b.LastEventAt,
		StreamIDs: p.streamIDsAt(b.Pos),
	}
	if err := p.store.Ack(ctx, p.epoch, ack); err != nil {
		return err
	}
	p.tracker.Release(b.Bytes)
	m := p.r.cfg.Metrics
	m.MessagesFailed(len(ack.Failed))
	if ack.StreamIDs != nil {
		// With the term's server, also for a carry term's ids stored
		// without one (markAt): the record is this server's either way,
		// and the ids at or below acknowledged ones are never carried
		// from again, so the record stays bounded through a long carry
		// term.
		p.r.streamSent.trim(p.streamServer, ack.StreamIDs.IDs)
	}
	if ack.HasPos {
		p.ackedPos = b.Pos.Position
		p.r.failover.acked(b.Pos.Position)
	}
	if !b.LastEventAt.IsZero() {
		p.lastEventAt = b.LastEventAt
	}
	*b = ordering.Batch[mark]{}
	p.lastAck = time.Now()
	return nil
}

// observe refreshes the pipeline's share of the in-flight gauges, tells
// the backlog watch how many rows the pipeline holds (read, not yet
// acknowledged), and now and then computes how long until the stored
// position would be purged from the binlog.
func (p *pipeline) observe(ctx context.Context) {
	msgs, bytes := p.tracker.Inflight()
	p.ackMu.Lock()
	p.r.backlog.held.Store(int64(msgs + p.pendingAck.Rows()))
	lastEvent, file := p.lastEventAt, p.ackedPos.File
	p.ackMu.Unlock()
	m := p.r.cfg.Metrics
	if m == nil {
		return
	}
	m.SetInflight(msgs, bytes)
	if file != "" && time.Since(p.lastHeadroom) >= headroomEvery {
		p.lastHeadroom = time.Now()
		if _, err := m.UpdateRetentionHeadroom(ctx, p.r.db, file, lastEvent); err != nil {
			p.r.log.Debug("binlog retention headroom not computed", zap.Error(err))
		}
	}
}
