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
	"github.com/outbox-relay/outbox-relay/poller"
	"github.com/outbox-relay/outbox-relay/position"
)

// storedPosition is the binlog position of a progress row.
func storedPosition(progress checkpoint.Progress) position.Position {
	st := progress.Position
	return position.Position{Flavor: st.Flavor, GTIDSet: st.GTIDSet, File: st.File, Pos: uint32(st.Pos)}
}

// read delivers what is already pending when needed, then tails the binlog
// until ctx ends or an error. progress is the stored row, which the term's
// failover check (checkTerm) compared with the server; lost: the server
// lacks published transactions and Config.AcceptLostGTIDs resumes from its
// own position.
func (p *pipeline) read(ctx context.Context, progress checkpoint.Progress, lost bool) error {
	r := p.r
	h := &handler{p: p}
	from := storedPosition(progress)
	resume := !(progress.Position.IsZero() || Mode(progress.Mode) == ModePoll || lost)
	// Before anything of the term publishes (the sweep included).
	if err := p.decideStreamIDs(ctx, progress, resume); err != nil {
		return err
	}
	if !resume {
		var stopped bool
		var err error
		if from, stopped, err = p.sweepThenWindow(ctx, h); err != nil || stopped {
			return err
		}
	} else {
		p.markPositioned()
		if err := r.binlog.CheckPosition(ctx, from); err != nil {
			return positionError(err)
		}
	}
	// After the sweep: the lanes' ids start above what it sent.
	if err := p.startIDs(ctx, progress); err != nil {
		return err
	}
	r.failover.startTerm(from.Flavor)
	src, err := r.binlog.Open(func(err error, attempt int) {
		r.cfg.Metrics.Reconnected(metrics.TargetBinlog)
		p.watch.onRetry(err, attempt)
	})
	if err != nil {
		return err
	}
	r.clearFailed(ctx, p.epoch) // before the flag: whoever sees it sees the status cleared
	r.tailing.Store(true)
	// Logged after the flag: whoever reads this line sees /readyz answer 200.
	r.log.Info("tailing the binlog", zap.String("from", from.String()))
	defer r.tailing.Store(false)
	err = src.Run(ctx, from, h)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return r.binlogOnlyError(positionError(err))
}

// markPositioned says the stream's start is fixed: every transaction that
// commits from now on is one the stream reads.
func (p *pipeline) markPositioned() { p.positionOnce.Do(func() { close(p.positioned) }) }

// sweepThenWindow starts a term whose stored position, if any, is older
// than what was delivered (a first start, the last leader polled, or a
// lossy failover accepted with --accept-lost-gtids): it takes the server's
// position Gs, delivers everything pending (the sweep), takes Ge, and
// opens h's handover window: the tail starts from Gs (from) and publishes
// only rows still pending up to Ge (docs/operations.md, "Modes"). stopped:
// a shutdown or a pause ended the sweep, and nothing is to be tailed.
//
// Gs and Ge come from consistent snapshots (canal.SnapshotPosition): every
// transaction at or before one is visible to every read after it was
// taken, and none after it was visible then. So:
//   - a transaction in Gs is visible to the sweep, which starts after Gs:
//     the sweep delivers its rows (or a poller did before); the tail starts
//     after Gs and rightly skips it.
//   - a transaction the sweep saw was visible before Ge was taken, so it is
//     in Ge: past Ge the tail publishes everything and sends nothing the
//     sweep sent.
//   - a transaction between Gs and Ge is visible to the window's pending
//     checks, which run after Ge was taken: a row still pending was not
//     delivered by the sweep (which deletes or marks what it delivers, and
//     committed before Ge), so it is published once; a row gone was
//     delivered.
//
// @@gtid_binlog_pos would not do: it holds a transaction from its binlog
// write on, before its commit is visible, so that transaction could be in
// Gs yet invisible to the sweep (delivered by neither), or at or before Ge
// yet invisible to a pending check (skipped). After a lossy failover
// accepted with --accept-lost-gtids the stored position is no reference
// either: the same applies.
func (p *pipeline) sweepThenWindow(ctx context.Context, h *handler) (from position.Position, stopped bool, err error) {
	r := p.r
	p.mode.Store(ModePoll)
	gs, err := r.binlog.SnapshotPosition(ctx)
	if err != nil {
		return from, false, fmt.Errorf("read the server's binlog position before the sweep: %w", err)
	}
	drainer, err := p.pub.Drainer()
	if err != nil {
		return from, false, err
	}
	swept, err := p.sweep(ctx, drainer)
	if errors.Is(err, poller.ErrStopped) {
		r.log.Info("stopped delivering the rows pending before the binlog (the sweep); the rest is delivered when the relay resumes or restarts",
			zap.Int("rows", swept))
		return from, true, nil
	}
	if err != nil {
		return from, false, fmt.Errorf("deliver pending rows before tailing: %w", err)
	}
	// Only now may the due-time sweep start (it waits for this): the sweep's
	// rounds deliver the delayed rows due meanwhile, and both claim them FOR
	// UPDATE SKIP LOCKED, so side by side the due-time sweep would take a
	// key's later delayed row while a round still publishes its earlier one.
	// The tail starts at Gs, before the due-time sweep's first look, so it
	// reads (and hints) every delayed row committed after that look.
	p.markPositioned()
	ge, err := r.binlog.SnapshotPosition(ctx)
	if err != nil {
		return from, false, fmt.Errorf("read the server's binlog position after the sweep: %w", err)
	}
	r.log.Info("delivered pending rows before tailing the binlog", zap.Int("rows", swept),
		zap.String("from", gs.String()), zap.String("until", ge.String()))
	if err := h.openWindow(gs, ge, r.cfg.MaxInflightBytes); err != nil {
		return from, false, err
	}
	if !h.window {
		p.mode.Store(ModeBinlog)
	}
	return gs, false, nil
}

// binlogOnlyError makes binlog events that cannot be given as committed
// outbox rows (a table map without a contract column, a statement-logged
// write) a setup error in Config.Mode binlog (exit 2, status FAILED), with
// the way out: re-reading them after a restart gives the same error. Auto
// mode polls instead (fallbackReason).
func (r *Relay) binlogOnlyError(err error) error {
	if r.cfg.Mode != ModeBinlog {
		return err
	}
	const wayOut = "then run the relay once with Config.Mode auto (or poll): it delivers them from the table and " +
		"returns to the binlog past this transaction, from where Config.Mode binlog goes on"
	var (
		schema *canal.SchemaError
		stmt   *canal.StatementError
	)
	switch {
	case errors.As(err, &schema):
		return &ConfigError{fmt.Errorf("binlog mode cannot read past this transaction: %w; the rows written since are in "+
			"the table: give the table its contract columns back if it still lacks them, "+wayOut, err)}
	case errors.As(err, &stmt):
		return &ConfigError{fmt.Errorf("binlog mode cannot read past this transaction: %w; its rows are in the table: "+
			"set binlog_format=ROW for every session writing the outbox (SET GLOBAL binlog_format='ROW', and no "+
			"SET SESSION binlog_format in producers), "+wayOut, err)}
	}
	return err
}

// positionError makes a purged checkpoint a setup error (exit 2 in --mode
// binlog, docs/operations.md, "Server requirements"): restarting cannot bring the position back. In auto
// mode it sends the relay to poll mode instead (fallbackReason). A
// *canal.DivergedError is not one: the server's history changed under a
// reconnect, and restarting the term from the durable checkpoint is its
// remedy (Run does so for every error that is not fatal).
func positionError(err error) error {
	var purged *canal.PurgedError
	if errors.As(err, &purged) {
		return &ConfigError{err}
	}
	return err
}

// windowRows is the most rows the handover window buffers before their
// pending check (one query per batch).
const windowRows = 500

// handler receives the binlog stream.
type handler struct {
	p           *pipeline
	window      bool // between the sweep's start and end positions: publish only rows still pending
	windowUntil position.Position
	// passed holds, for GTID positions, every transaction read since the
	// sweep's start: the window closes exactly when it covers windowUntil
	// (per domain and server id on MariaDB, where a position alone
	// cannot tell).
	passed *position.GTIDs
	buf    windowBuf
}

// openWindow sets up the handover window: the tail starts at gs, and rows up
// to ge are published only if still pending. Rows wait in a buffer bounded
// by windowRows and a quarter of maxInflight bytes.
func (h *handler) openWindow(gs, ge position.Position, maxInflight int64) error {
	h.windowUntil = ge
	h.buf.maxBytes = max(int(maxInflight/4), 1)
	if ge.GTIDSet != "" {
		passed, err := position.NewGTIDs(ge.Flavor, gs.GTIDSet)
		if err != nil {
			return fmt.Errorf("handover window from %s: %w", gs, err)
		}
		h.passed = passed
		covered, err := passed.Covers(ge)
		if err != nil {
			return fmt.Errorf("handover window until %s: %w", ge, err)
		}
		h.window = !covered
		return nil
	}
	reached, err := position.Reached(gs, ge)
	if err != nil {
		return fmt.Errorf("handover window %s..%s: %w", gs, ge, err)
	}
	h.window = !reached
	return nil
}

func (h *handler) Row(ctx context.Context, rec *outbox.Record) error {
	h.p.rowsRead.Add(1)
	if !h.p.enterTxn() {
		h.p.cancelRead()
		return context.Canceled
	}
	if !rec.AvailableAt.IsZero() {
		// Delayed (available_at set, due or not): left pending and not
		// acknowledged here; the due-time sweep delivers it, so the two
		// never publish the same row. It does not hold back its partition.
		// Its due time wakes the sweep if it is the earliest.
		h.p.due.offer(rec.AvailableAt)
		return nil
	}
	if h.window {
		if h.buf.add(rec) {
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
		var done bool
		var err error
		if h.passed != nil {
			if err = h.passed.Passed(pos); err == nil {
				done, err = h.passed.Covers(h.windowUntil)
			}
		} else {
			done, err = position.Reached(pos, h.windowUntil)
		}
		if err != nil {
			return fmt.Errorf("handover window until %s, at %s: %w", h.windowUntil, pos, err)
		}
		if done {
			h.window = false
			h.passed = nil
			h.p.mode.Store(ModeBinlog)
		}
	}
	h.p.tracker.Commit(h.p.markAt(pos, h.window))
	h.p.leaveTxn()
	return nil
}

// flushWindow publishes those buffered rows that are still pending: the sweep
// delivered (and removed or marked) the others.
func (h *handler) flushWindow(ctx context.Context) error {
	buf := h.buf.take()
	if len(buf) == 0 {
		return nil
	}
	p := h.p
	ids := make([]uint64, len(buf))
	for i, rec := range buf {
		ids[i] = rec.ID
	}
	pending, err := p.store.Pending(ctx, ids)
	if err != nil {
		return err
	}
	for _, rec := range buf {
		if pending[rec.ID] {
			if err := p.dispatch(ctx, rec); err != nil {
				return err
			}
		}
	}
	return nil
}

// windowBuf holds the window's rows until their pending check, bounded in
// rows (windowRows) and in bytes (maxBytes, by outbox.Record.Size): a
// transaction of large rows must not gather unbounded memory here before
// the in-flight bound (--max-inflight-bytes) applies to what is dispatched.
type windowBuf struct {
	recs     []*outbox.Record
	bytes    int
	maxBytes int
}

// add buffers rec and reports whether the buffer is full: flush it now.
func (b *windowBuf) add(rec *outbox.Record) bool {
	b.recs = append(b.recs, rec)
	b.bytes += rec.Size()
	return len(b.recs) >= windowRows || b.bytes >= b.maxBytes
}

// take empties the buffer and returns what it held.
func (b *windowBuf) take() []*outbox.Record {
	recs := b.recs
	b.recs, b.bytes = nil, 0
	return recs
}
