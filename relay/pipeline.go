package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/backoff"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/poller"
	"github.com/outbox-relay/outbox-relay/publish"
)

type ticket = ordering.Ticket[canal.Position]

// pipeline is one leader term: lanes publishing on their own channels, the
// tracker, the acker. It lives until leadership is lost, an error, or shutdown.
type pipeline struct {
	r         *Relay
	epoch     int64
	tracker   *ordering.Tracker[canal.Position]
	lanes     *ordering.Lanes
	queues    []chan *laneItem
	channels  []*publish.Channel
	publisher *publish.Publisher
	watch     *troubleWatch
	delayed   chan struct{} // capacity 1: the stream skipped a delayed row
	fallback  atomic.Value  // string: why binlog mode gave way to polling
	mode      atomic.Value  // string stored with acknowledgements: "poll" until the handover window closes

	ackMu       sync.Mutex
	pendingAck  ordering.Batch[canal.Position]
	lastAck     time.Time
	ackedPos    canal.Position // the stored position, after the last acknowledgement
	lastEventAt time.Time      // created_at of the newest acknowledged row

	lastHeadroom time.Time // acker goroutine only

	// Shutdown stops reading at a transaction boundary: a transaction whose
	// rows were handed to lanes is read to its end first, so a clean stop
	// leaves none half published (its rows would be published again).
	txnMu      sync.Mutex
	inTxn      bool // rows of the transaction being read were handed over
	stopping   bool
	cancelRead context.CancelFunc
}

type laneItem struct {
	tk  *ticket
	msg publish.Message
}

// runBinlog runs binlog mode for (the rest of) a leader term. It returns a
// switch to poll mode when an auto relay cannot read the binlog: then, as at
// shutdown, it first waits for in-flight confirms and acknowledges them.
func (r *Relay) runBinlog(ctx context.Context, leader *checkpoint.Leader) (*modeSwitch, error) {
	// pubCtx outlives ctx by the shutdown grace so in-flight confirms can
	// finish; it dies at once when leadership is lost.
	pubCtx, cancelPub := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPub()
	go func() {
		select {
		case <-leader.Lost():
			cancelPub()
		case <-pubCtx.Done():
		}
	}()
	// readCtx does not end with ctx: on shutdown reading stops at the next
	// transaction boundary (stopReading), or after ShutdownTimeout.
	readCtx, cancelRead := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRead()
	go func() {
		select {
		case <-leader.Lost():
			cancelRead()
		case <-readCtx.Done():
		}
	}()

	progress, err := r.store.Load(readCtx)
	if err != nil {
		return nil, err
	}
	publisher, err := r.newPublisher(pubCtx)
	if err != nil {
		return nil, err
	}
	defer publisher.Close()

	p := &pipeline{
		r: r, epoch: leader.Epoch(), publisher: publisher,
		tracker: ordering.New[canal.Position](r.cfg.MaxInflightBytes),
		lanes:   ordering.NewLanes(r.cfg.Lanes),
		lastAck: time.Now(), cancelRead: cancelRead,
	}
	p.mode.Store("binlog")
	p.delayed = make(chan struct{}, 1)
	p.watch = &troubleWatch{r: r, stop: func(reason string) {
		p.fallback.Store(reason)
		cancelRead()
	}}
	go p.stopReading(ctx, readCtx)
	if err := p.openLanes(); err != nil {
		return nil, err
	}
	laneDone := make(chan error, len(p.queues))
	for i := range p.queues {
		go func() { laneDone <- p.runLane(pubCtx, i) }()
	}
	ackStop := make(chan struct{})
	ackDone := make(chan error, 1)
	go func() { ackDone <- p.acker(pubCtx, ackStop) }()
	sweepStop := make(chan struct{})
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		p.sweepDelayed(pubCtx, sweepStop)
	}()

	readErr := p.read(readCtx, progress)
	close(sweepStop) // between rounds: a round under way commits
	<-sweepDone
	for _, q := range p.queues {
		close(q)
	}
	shuttingDown := ctx.Err() != nil && leader.Err() == nil
	if !shuttingDown && readErr == nil {
		readErr = leader.Err()
	}
	fallback, _ := p.fallback.Load().(string)
	if fallback == "" && leader.Err() == nil {
		fallback = r.fallbackReason(readErr)
	}
	if fallback != "" {
		r.log.Warn("binlog mode stopped; finishing in-flight confirms, then polling", zap.String("reason", fallback))
	}

	// Drain: on shutdown wait (bounded) for the confirms of everything
	// published, then acknowledge it. Otherwise stop at once: what is not
	// acknowledged is published again by the next term.
	if shuttingDown || fallback != "" {
		r.log.Info("stopping binlog mode: waiting for in-flight confirms")
		waitCtx, cancel := context.WithTimeout(pubCtx, r.cfg.ShutdownTimeout)
		if err := p.tracker.WaitIdle(waitCtx); err != nil {
			m, b := p.tracker.Inflight()
			r.log.Warn("shutdown timeout: unconfirmed messages will be published again on restart",
				zap.Int("messages", m), zap.Int64("bytes", b))
		}
		cancel()
	} else {
		cancelPub()
	}
	close(ackStop)
	ackErr := <-ackDone
	cancelPub()
	for range p.queues {
		<-laneDone
	}
	switch {
	case shuttingDown:
		return nil, ackErr
	case fallback != "" && ackErr == nil:
		return &modeSwitch{to: ModePoll, reason: fallback}, nil
	case readErr == nil:
		return nil, ackErr
	}
	return nil, readErr
}

func (p *pipeline) openLanes() error {
	p.queues = make([]chan *laneItem, p.lanes.N())
	p.channels = make([]*publish.Channel, p.lanes.N())
	for i := range p.queues {
		p.queues[i] = make(chan *laneItem, p.r.cfg.ConfirmWindow)
		ch, err := p.publisher.NewChannel(p.onResult)
		if err != nil {
			return fmt.Errorf("open publishing lane %d: %w", i, err)
		}
		p.channels[i] = ch
	}
	return nil
}

func (p *pipeline) onResult(res publish.Result) {
	tk := res.Tag.(*ticket)
	rec := tk.Record()
	if res.Outcome == publish.Confirmed {
		p.r.cfg.Metrics.Delivered(rec.CreatedAt, time.Now())
		p.tracker.Done(tk, true, "")
		return
	}
	if res.Outcome == publish.Rejected {
		p.r.cfg.Metrics.PublishFailed(metrics.ReasonNacked)
	} else {
		p.r.cfg.Metrics.PublishFailed(metrics.ReturnReason(res.Code))
	}
	p.r.log.Warn("message not delivered, recording it in outbox_failed",
		zap.String("message_id", rec.MessageID.String()), zap.Uint64("id", rec.ID), zap.String("reason", res.Reason))
	p.tracker.Done(tk, false, res.Reason)
}

// runLane publishes one lane's messages in order. It returns when its queue is
// closed and drained, or when ctx ends.
func (p *pipeline) runLane(ctx context.Context, i int) error {
	ch := p.channels[i]
	for item := range p.queues[i] {
		if err := ch.Publish(ctx, item.msg); err != nil {
			return fmt.Errorf("lane %d: %w", i, err)
		}
	}
	return nil
}

// stopReading ends reading when ctx ends: at once between transactions,
// else when the transaction being read commits, or after ShutdownTimeout.
func (p *pipeline) stopReading(ctx, readCtx context.Context) {
	select {
	case <-ctx.Done():
	case <-readCtx.Done():
		return
	}
	p.txnMu.Lock()
	p.stopping = true
	now := !p.inTxn
	p.txnMu.Unlock()
	if now {
		p.cancelRead()
		return
	}
	t := time.NewTimer(p.r.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-t.C:
		p.r.log.Warn("shutdown: the transaction being read did not end within the shutdown timeout; " +
			"its rows published so far will be published again on restart")
		p.cancelRead()
	case <-readCtx.Done():
	}
}

// enterTxn is called for each row read; false when shutdown has begun
// between transactions (reading has been stopped).
func (p *pipeline) enterTxn() bool {
	p.txnMu.Lock()
	defer p.txnMu.Unlock()
	if p.stopping && !p.inTxn {
		return false
	}
	p.inTxn = true
	return true
}

// leaveTxn is called after each transaction; on shutdown it stops reading.
func (p *pipeline) leaveTxn() {
	p.txnMu.Lock()
	stop := p.stopping
	p.inTxn = false
	p.txnMu.Unlock()
	if stop {
		p.cancelRead()
	}
}

// dispatch hands one row to its lane. A row that cannot become an AMQP
// message is resolved at once as failed: it goes to outbox_failed and its
// partition moves on.
func (p *pipeline) dispatch(ctx context.Context, rec *outbox.Record) error {
	tk, err := p.tracker.Add(ctx, rec)
	if err != nil {
		return err
	}
	msg, err := publish.FromRecord(rec, p.r.cfg.DefaultExchange, p.epoch, false)
	if err != nil {
		p.r.log.Warn("row cannot be published, recording it in outbox_failed",
			zap.String("message_id", rec.MessageID.String()), zap.Uint64("id", rec.ID), zap.Error(err))
		p.r.cfg.Metrics.PublishFailed(metrics.ReasonBadRecord)
		p.tracker.Done(tk, false, err.Error())
		return nil
	}
	msg.Tag = tk
	msg.Size = rec.Size()
	select {
	case p.queues[p.lanes.For(rec.PartitionKey)] <- &laneItem{tk: tk, msg: msg}:
		return nil
	case <-ctx.Done():
		// Never handed to a lane, so never published; resolve its ticket
		// so WaitIdle does not wait for it. Its transaction is never
		// acknowledged: Row fails, so the tailer stops before its Commit.
		p.tracker.Done(tk, false, "not published: reading stopped")
		return ctx.Err()
	}
}

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
	for {
		final := false
		select {
		case <-p.tracker.Changed():
			// Coalesce: acknowledging every confirm on its own costs the
			// database a transaction per message — at 500 msg/s as much as
			// the producers' own commits. At most one per ackGap; a crash
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
// by that interval.
func (p *pipeline) flushAck(ctx context.Context, force bool) error {
	p.ackMu.Lock()
	defer p.ackMu.Unlock()
	if b, ok := p.tracker.Take(); ok {
		p.pendingAck.Merge(b)
	}
	b := &p.pendingAck
	hasRows := len(b.IDs) > 0 || len(b.Failed) > 0
	if !hasRows && (!b.HasPos || !force && time.Since(p.lastAck) < p.r.cfg.CheckpointInterval) {
		return nil
	}
	ack := checkpoint.Ack{
		Pos:    checkpoint.Position{Flavor: b.Pos.Flavor, GTIDSet: b.Pos.GTIDSet, File: b.Pos.File, Pos: uint64(b.Pos.Pos)},
		HasPos: b.HasPos && !b.Pos.IsZero(), Mode: p.mode.Load().(string),
		IDs: b.IDs, Failed: b.Failed, LastEventAt: b.LastEventAt,
	}
	if err := p.r.store.Ack(ctx, p.epoch, ack); err != nil {
		return err
	}
	m := p.r.cfg.Metrics
	m.MessagesFailed(len(ack.Failed))
	if ack.HasPos {
		p.ackedPos = b.Pos
	}
	if !b.LastEventAt.IsZero() {
		p.lastEventAt = b.LastEventAt
	}
	*b = ordering.Batch[canal.Position]{}
	p.lastAck = time.Now()
	return nil
}

// observe refreshes the gauges that describe the pipeline: in flight,
// pending (read but not yet acknowledged), lag, and — now and then — how
// long until the stored position would be purged from the binlog.
func (p *pipeline) observe(ctx context.Context) {
	m := p.r.cfg.Metrics
	if m == nil {
		return
	}
	msgs, bytes := p.tracker.Inflight()
	m.SetInflight(msgs, bytes)
	p.ackMu.Lock()
	pending := int64(msgs + p.pendingAck.Rows())
	lastEvent, file := p.lastEventAt, p.ackedPos.File
	p.ackMu.Unlock()
	m.SetPendingRows(pending)
	m.SetLag(lastEvent, pending == 0)
	if file != "" && time.Since(p.lastHeadroom) >= time.Minute {
		p.lastHeadroom = time.Now()
		if _, err := m.UpdateRetentionHeadroom(ctx, p.r.db, file, lastEvent); err != nil {
			p.r.log.Debug("binlog retention headroom not computed", zap.Error(err))
		}
	}
}

// read delivers what is already pending when needed, then tails the binlog
// until ctx ends or an error.
func (p *pipeline) read(ctx context.Context, progress checkpoint.Progress) error {
	r := p.r
	h := &handler{p: p}
	var from canal.Position
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
		if h.window, err = reached(gs, ge); err != nil {
			return err
		}
		h.window = !h.window
		if !h.window {
			p.mode.Store("binlog")
		}
	} else {
		st := progress.Position
		from = canal.Position{Flavor: st.Flavor, GTIDSet: st.GTIDSet, File: st.File, Pos: uint32(st.Pos)}
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
	windowUntil canal.Position
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

func (h *handler) Commit(ctx context.Context, pos canal.Position, rows int) error {
	if h.window {
		if err := h.flushWindow(ctx); err != nil {
			return err
		}
		done, err := reached(pos, h.windowUntil)
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
	args := make([]any, len(h.buf))
	for i, rec := range h.buf {
		args[i] = rec.ID
	}
	q := "SELECT id FROM `" + p.r.cfg.Table + "` WHERE id IN (?" + strings.Repeat(",?", len(args)-1) + ")"
	if p.r.cfg.OnDelivered == checkpoint.Mark {
		q += " AND delivered_at IS NULL"
	}
	rows, err := p.r.db.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("check which of %d rows are still pending: %w", len(args), err)
	}
	pending := make(map[uint64]bool, len(args))
	for rows.Next() {
		var id uint64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fmt.Errorf("check which rows are still pending: %w", err)
		}
		pending[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check which rows are still pending: %w", err)
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

// reached reports whether pos is at or past until.
func reached(pos, until canal.Position) (bool, error) {
	if until.GTIDSet == "" && until.File == "" {
		return true, nil
	}
	if until.GTIDSet != "" {
		if pos.GTIDSet == "" {
			return false, nil
		}
		have, err := gomysql.ParseGTIDSet(pos.Flavor, pos.GTIDSet)
		if err != nil {
			return false, fmt.Errorf("parse position %q: %w", pos.GTIDSet, err)
		}
		want, err := gomysql.ParseGTIDSet(until.Flavor, until.GTIDSet)
		if err != nil {
			return false, fmt.Errorf("parse position %q: %w", until.GTIDSet, err)
		}
		return have.Contain(want), nil
	}
	if pos.File != until.File {
		return pos.File > until.File, nil
	}
	return pos.Pos >= until.Pos, nil
}

// sweepDelayed is the due-time sweep of binlog mode (design §4.7): while
// delayed rows are known to exist (one probe at start, then whenever the
// stream skips one) it delivers those that are due, every poll interval. A
// relay without delayed rows runs no query here after the probe. It stops
// between rounds when stop closes; errors are logged and retried (a lost
// leadership also stops the acker, which ends the term).
func (p *pipeline) sweepDelayed(ctx context.Context, stop <-chan struct{}) {
	r := p.r
	pl, err := r.newPoller(p.publisher, p.epoch)
	if err == nil {
		var s *poller.DelayedSweeper
		if s, err = pl.NewDelayedSweeper(); err == nil {
			defer s.Close()
			p.runSweeper(ctx, stop, s, pl.Config().Interval)
			return
		}
	}
	r.log.Error("due-time sweep not started; delayed rows wait for the next handover", zap.Error(err))
}

func (p *pipeline) runSweeper(ctx context.Context, stop <-chan struct{}, s *poller.DelayedSweeper, interval time.Duration) {
	log := p.r.log.Named("delayed")
	active, err := s.Pending(ctx)
	if err != nil {
		log.Warn("probe for delayed rows failed; sweeping to be safe", zap.Error(err))
		active = true
	}
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
			continue
		case <-tick.C:
		}
		if !active {
			continue
		}
		n, err := s.Round(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, checkpoint.ErrFenced) {
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
		}
	}
}
