package relay

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// read delivers what is already pending when needed, then tails the binlog
// until ctx ends or an error.
func (p *pipeline) read(ctx context.Context, progress checkpoint.Progress) error {
	r := p.r
	h := &handler{p: p}
	var from position.Position
	if progress.Position.IsZero() || progress.Mode == "poll" {
		// First start (or the last leader polled): the stored position, if
		// any, is older than what was delivered. Take the current position,
		// deliver everything pending, and tail from that position publishing
		// only rows still pending up to where the sweep ended (design §5).
		p.mode.Store("poll")
		gs, err := canal.CurrentPosition(ctx, r.db)
		if err != nil {
			return fmt.Errorf("read the server's binlog position: %w", err)
		}
		drainer, err := r.newPoller(p.publisher, p.epoch)
		if err != nil {
			return err
		}
		swept, err := drainer.Drain(ctx)
		if err != nil {
			return fmt.Errorf("deliver pending rows before tailing: %w", err)
		}
		ge, err := canal.CurrentPosition(ctx, r.db)
		if err != nil {
			return fmt.Errorf("read the server's binlog position: %w", err)
		}
		r.log.Info("delivered pending rows before tailing the binlog", zap.Int("rows", swept),
			zap.String("from", gs.String()), zap.String("until", ge.String()))
		from, h.windowUntil = gs, ge
		if h.window, err = position.Reached(gs, ge); err != nil {
			return err
		}
		h.window = !h.window
		if !h.window {
			p.mode.Store("binlog")
		}
	} else {
		st := progress.Position
		from = position.Position{Flavor: st.Flavor, GTIDSet: st.GTIDSet, File: st.File, Pos: uint32(st.Pos)}
		if err := canal.CheckPosition(ctx, r.db, from); err != nil {
			return positionError(err)
		}
	}
	cc := r.canal
	cc.OnRetry = func(err error, attempt int) {
		r.cfg.Metrics.Reconnected(metrics.TargetBinlog)
		p.watch.onRetry(err, attempt)
	}
	tailer, err := canal.New(cc)
	if err != nil {
		return &ConfigError{err}
	}
	r.tailing.Store(true)
	// Logged after the flag: whoever reads this line sees /readyz answer 200.
	r.log.Info("tailing the binlog", zap.String("from", from.String()))
	defer r.tailing.Store(false)
	err = tailer.Run(ctx, from, h)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return positionError(err)
}

// positionError makes a purged or diverged checkpoint a setup error (exit 2
// in --mode binlog, design §4.1): restarting cannot bring the position back.
// In auto mode it sends the relay to poll mode instead (fallbackReason).
func positionError(err error) error {
	var purged *canal.PurgedError
	var diverged *canal.DivergedError
	if errors.As(err, &purged) || errors.As(err, &diverged) {
		return &ConfigError{err}
	}
	return err
}

// handler receives the binlog stream.
type handler struct {
	p           *pipeline
	window      bool // between the sweep's start and end positions: publish only rows still pending
	windowUntil position.Position
	buf         []*outbox.Record
}

func (h *handler) Row(ctx context.Context, rec *outbox.Record) error {
	if !h.p.enterTxn() {
		h.p.cancelRead()
		return context.Canceled
	}
	if !rec.AvailableAt.IsZero() {
		// Delayed (available_at set, due or not): left pending and not
		// acknowledged here; the due-time sweep delivers it, so the two
		// never publish the same row. It does not hold back its partition.
		select {
		case h.p.delayed <- struct{}{}:
		default:
		}
		return nil
	}
	if h.window {
		h.buf = append(h.buf, rec)
		if len(h.buf) >= 500 {
			return h.flushWindow(ctx)
		}
		return nil
	}
	return h.p.dispatch(ctx, rec)
}

func (h *handler) Commit(ctx context.Context, pos position.Position, rows int) error {
	if h.window {
		if err := h.flushWindow(ctx); err != nil {
			return err
		}
		done, err := position.Reached(pos, h.windowUntil)
		if err != nil {
			return err
		}
		if done {
			h.window = false
			h.p.mode.Store("binlog")
		}
	}
	h.p.tracker.Commit(pos)
	h.p.leaveTxn()
	return nil
}

// flushWindow publishes those buffered rows that are still pending: the sweep
// delivered (and removed or marked) the others.
func (h *handler) flushWindow(ctx context.Context) error {
	if len(h.buf) == 0 {
		return nil
	}
	p := h.p
	ids := make([]uint64, len(h.buf))
	for i, rec := range h.buf {
		ids[i] = rec.ID
	}
	pending, err := p.r.store.Pending(ctx, ids)
	if err != nil {
		return err
	}
	buf := h.buf
	h.buf = nil
	for _, rec := range buf {
		if pending[rec.ID] {
			if err := p.dispatch(ctx, rec); err != nil {
				return err
			}
		}
	}
	return nil
}
