package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/poller"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/publish"
)

type ticket = ordering.Ticket[mark]

// pipeline is one leader term: lanes publishing on their own channels, the
// tracker, the acker. It lives until leadership is lost, an error, or shutdown.
type pipeline struct {
	r        *Relay
	leader   lease
	store    progressStore
	epoch    int64
	tracker  *ordering.Tracker[mark]
	lanes    *ordering.Lanes
	queues   []chan *laneItem
	channels []sink
	// pub is the run's publisher: its connection, which a stop watches,
	// the sweep before tailing and the due-time sweep.
	pub   binlogPublisher
	watch *troubleWatch
	due   *dueHint // the stream's delayed rows, for the due-time sweep
	// positioned is closed once the stream's start is fixed (markPositioned):
	// the due-time sweep's first look waits for it.
	positioned   chan struct{}
	positionOnce sync.Once
	fallback     atomic.Value // string: why binlog mode gave way to polling
	mode         atomic.Value // Mode stored with acknowledgements: ModePoll until the handover window closes

	ackMu       sync.Mutex
	pendingAck  ordering.Batch[mark]
	lastAck     time.Time
	ackedPos    position.Position // the stored position, after the last acknowledgement
	lastEventAt time.Time         // created_at of the newest acknowledged row

	lastHeadroom time.Time // acker goroutine only

	// Shutdown (or a pause) stops reading at a transaction boundary: a
	// transaction whose rows were handed to lanes is read to its end first,
	// so a clean stop leaves none half published (its rows would be
	// published again). The delivery of pending rows before tailing (the
	// sweep) counts as one transaction: it stops between poll rounds.
	txnMu      sync.Mutex
	inTxn      bool // rows of the transaction being read were handed over, or the sweep runs
	sweeping   bool // the sweep runs (inTxn is set too)
	stopping   bool
	stop       chan struct{} // closed when stopping begins
	cancelRead context.CancelFunc
	txnRows    atomic.Int64 // rows of the transaction being read handed to lanes
	rowsRead   atomic.Int64 // outbox rows the stream has read this run (the settings watch's activity)

	// The stream destination's publishing ids (streamdest.go): nil
	// without it; the reader's goroutine only.
	ids      []uint64
	idsSnap  []uint64
	idsDirty bool
	// streamCont: the term continues the stored ids; streamServer: the
	// identity of the server it reads (decideStreamIDs, before the term
	// publishes).
	streamCont   bool
	streamServer string
	// streamCarry: the stored ids were read on another server and
	// decideStreamIDs found them possibly carried over; carry: the
	// term carries them, checking each id (startIDs; streamcarry.go).
	streamCarry bool
	carry       *carry

	failMu  sync.Mutex
	failErr error // a failed stream producer ended the term
}

type laneItem struct {
	tk  *ticket
	msg publish.Message
}

// runBinlog runs binlog mode for (the rest of) a leader term. It returns a
// switch to poll mode when an auto relay cannot read the binlog: then, as at
// shutdown, it first waits for in-flight confirms and acknowledges them.
//
// Nothing that publishes starts before the term's lossy-failover check
// (checkTerm) has returned: a server that lacks published transactions is
// refused before a lane, the due-time sweep or the sweep before tailing
// could publish (and delete) a row on it.
//
// It reads on the caller's goroutine and owns a group of named goroutines:
//
//   - "lease-watch" ends reading and publishing at once when leadership is lost;
//   - "stop-reading" ends reading at a transaction boundary once ctx ends
//     (shutdown or pause), or after ShutdownTimeout (stopReading);
//   - "lane", one per lane, publishes its queue in order (runLane);
//   - "acker" acknowledges the low watermark (acker);
//   - "state-file" writes Config.StateFile as the published position moves,
//     whatever the acknowledgements do (failoverCheck.follow);
//   - "sweep-delayed" delivers due delayed rows (sweepDelayed);
//   - "settings-watch" says when the server's binlog settings change under
//     it (watchSettings).
//
// Once reading has ended, one shutdown policy stops them in this order
// (then stopPipeline): the sweep between its rounds; the lanes' queues are
// closed; in-flight confirms are drained, bounded by ShutdownTimeout, on
// a shutdown or a fallback (otherwise publishing stops at once: what is
// not acknowledged is published again by the next term); the acker, after
// its final acknowledgement; the lanes; the state file's writer (the term
// writes the file once more after the run: Relay.runMode).
func (r *Relay) runBinlog(ctx context.Context, leader lease) (*modeSwitch, error) {
	var g group
	defer g.Close()
	// pubCtx outlives ctx by the shutdown grace so in-flight confirms can
	// finish; readCtx does not end with ctx: on shutdown reading stops at
	// the next transaction boundary (stopReading), or after
	// ShutdownTimeout. Both end at once when leadership is lost.
	pubCtx, cancelPub := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPub()
	readCtx, cancelRead := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRead()
	watchStop := make(chan struct{})
	g.Go("lease-watch", func() { close(watchStop) }, func() error {
		select {
		case <-leader.Lost():
			cancelPub()
			cancelRead()
		case <-watchStop:
		}
		return nil
	})

	// Before anything of the term can publish: the lossy-failover check.
	progress, lost, err := r.checkTerm(ctx, readCtx)
	if err != nil {
		return binlogEnd(r.log, ctx.Err() != nil && leader.Err() == nil, nil, err, nil, leader.Err())
	}
	publisher, err := r.openBinlog(pubCtx, leader)
	if err != nil {
		return nil, err
	}
	defer r.closeLogged("binlog mode's publisher", publisher)

	p := r.newPipeline(leader, publisher, cancelRead)
	g.Go("stop-reading", cancelRead, func() error { p.stopReading(ctx, readCtx); return nil })
	if err := p.openLanes(publisher.NewSink); err != nil {
		return nil, err
	}
	p.start(&g, pubCtx)
	p.watchSinks(&g)
	sweepStop := make(chan struct{})
	g.Go("sweep-delayed", func() { close(sweepStop) }, func() error { p.sweepDelayed(pubCtx, sweepStop); return nil })
	settingsStop := make(chan struct{})
	g.Go("settings-watch", func() { close(settingsStop) }, func() error { p.watchSettings(readCtx, settingsStop); return nil })

	readErr := p.read(readCtx, progress, lost)
	if err := p.failure(); err != nil && readErr == nil {
		readErr = err
	}
	g.Stop("settings-watch")
	g.Stop("sweep-delayed") // between rounds: a round under way commits
	g.Signal("lane")        // close the queues: a lane returns once it has published its queue

	shuttingDown := ctx.Err() != nil && leader.Err() == nil
	if !shuttingDown && readErr == nil {
		readErr = leader.Err()
	}
	var next *modeSwitch
	if fallback, _ := p.fallback.Load().(string); fallback != "" {
		next = &modeSwitch{to: ModePoll, reason: fallback}
	} else if leader.Err() == nil && !shuttingDown {
		next = r.detour(readErr)
	}
	switch {
	case next == nil:
	case next.to == ModePoll:
		r.log.Warn("binlog mode stopped; finishing in-flight confirms, then polling", zap.String("reason", next.reason))
	default:
		r.log.Info("binlog mode stopped; finishing in-flight confirms, then the handover to the binlog", zap.String("reason", next.reason))
	}
	ackErr := p.stopPipeline(&g, pubCtx, cancelPub, shuttingDown || next != nil)
	if next != nil && next.handover {
		r.waitXAVisible(ctx, readErr)
	}
	return binlogEnd(r.log, shuttingDown, next, readErr, ackErr, leader.Err())
}

// checkTerm reads the stored progress row and runs the term's
// lossy-failover check (failoverCheck.checkNotLost) with it, before
// anything of the term is started. Both end with readCtx (leadership lost)
// and with ctx (a shutdown or a pause: nothing is under way yet to be read
// to its end). lost: the server lacks published transactions and
// Config.AcceptLostGTIDs lets the term resume from the server's own
// position.
func (r *Relay) checkTerm(ctx, readCtx context.Context) (progress checkpoint.Progress, lost bool, err error) {
	checkCtx, cancel := context.WithCancel(readCtx)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	if progress, err = r.progress.Load(checkCtx); err != nil {
		return progress, false, err
	}
	// A promoted replica, or a VIP that moved, may lack what was published:
	// checked on every term (docs/operations.md, "Primary failover").
	lost, err = r.failover.checkNotLost(checkCtx, storedPosition(progress))
	return progress, lost, err
}

// stopPipeline is the rest of binlog mode's shutdown policy, run once
// reading has ended and the sweep and the lanes' queues are stopped: it
// stops the acker, then the lanes, then the state file's writer, and
// returns the acker's error. With
// drain it first waits (bounded by ShutdownTimeout) for the confirms of
// everything published, so the acker's final round acknowledges it;
// without, publishing stops at once.
func (p *pipeline) stopPipeline(g *group, pubCtx context.Context, cancelPub context.CancelFunc, drain bool) error {
	if drain {
		p.drainConfirms(pubCtx)
	} else {
		cancelPub()
	}
	ackErr := g.Stop("acker")
	cancelPub()
	_ = g.Wait("lane") // a lane's error is the term's end, already seen by reading or the acker
	_ = g.Stop("state-file")
	return ackErr
}

// drainConfirms waits, at most ShutdownTimeout, until every message handed
// to a lane has its result; it logs what did not.
func (p *pipeline) drainConfirms(pubCtx context.Context) {
	r := p.r
	r.log.Info("stopping binlog mode: waiting for in-flight confirms")
	waitCtx, cancel := context.WithTimeout(pubCtx, r.cfg.ShutdownTimeout)
	defer cancel()
	if err := p.tracker.WaitIdle(waitCtx); err != nil {
		m, b := p.tracker.Inflight()
		r.log.Warn("stopping (shutdown or pause): in-flight confirms did not arrive within Config.ShutdownTimeout; "+
			"these unconfirmed messages, and the other messages of their transactions, will be published again when the relay continues",
			zap.Int("messages", m), zap.Int64("bytes", b), zap.Duration("shutdown_timeout", r.cfg.ShutdownTimeout))
	}
}

// binlogEnd decides how a binlog mode run ends, from how it stopped: on a
// shutdown (or pause) with the final acknowledgement's error; with next (a
// switch to poll mode after a fallback, or to the handover) once its
// acknowledgement worked; else with the error that ended it (leaseErr when
// leadership was lost).
func binlogEnd(log *zap.Logger, shuttingDown bool, next *modeSwitch, readErr, ackErr, leaseErr error) (*modeSwitch, error) {
	switch {
	case shuttingDown:
		return nil, ackErr
	case next != nil && ackErr == nil:
		return next, nil
	case next != nil:
		// Never readErr here: in auto mode its cause (a purged position, a
		// missing grant) is no reason to exit. The acknowledgement's error
		// restarts the term from the durable checkpoint, which decides the
		// mode again; what was not acknowledged is published again.
		return nil, fmt.Errorf("binlog mode stopped (%s); acknowledging before going on: %w", next.reason, ackErr)
	case readErr == nil:
		return nil, ackErr
	case leaseErr != nil:
		// Leadership lost: the next term decides again, also about a read
		// error that would be fatal (it may be a consequence of the loss).
		log.Warn("binlog mode stopped after leadership was lost", zap.Error(readErr))
		return nil, leaseErr
	}
	return nil, readErr
}

// newPipeline is the state of one binlog mode run of leader's term on
// pub; cancelRead ends its reading.
func (r *Relay) newPipeline(leader lease, pub binlogPublisher, cancelRead context.CancelFunc) *pipeline {
	p := &pipeline{
		r: r, leader: leader, epoch: leader.Epoch(), store: r.progress, pub: pub,
		tracker: ordering.New[mark](r.cfg.MaxInflightBytes),
		lanes:   ordering.NewLanes(r.laneCount()),
		lastAck: time.Now(), cancelRead: cancelRead, stop: make(chan struct{}),
		due: newDueHint(), positioned: make(chan struct{}),
	}
	p.mode.Store(ModeBinlog)
	p.watch = &troubleWatch{r: r, ping: r.ping1, stop: func(reason string) {
		p.fallback.Store(reason)
		cancelRead()
	}}
	return p
}

// start runs the lanes, the acker and the state file's writer in g,
// publishing and acknowledging under pubCtx.
func (p *pipeline) start(g *group, pubCtx context.Context) {
	for i := range p.queues {
		g.Go("lane", func() { close(p.queues[i]) }, func() error { return p.runLane(pubCtx, i) })
	}
	ackStop := make(chan struct{})
	g.Go("acker", func() { close(ackStop) }, func() error { return p.acker(pubCtx, ackStop) })
	stateStop := make(chan struct{})
	g.Go("state-file", func() { close(stateStop) }, func() error { p.r.failover.follow(stateStop); return nil })
}

// openLanes opens one sink per lane with open (whose callback gets every
// result of the sink), with its queue.
func (p *pipeline) openLanes(open func(onResult func(publish.Result)) (sink, error)) error {
	p.queues = make([]chan *laneItem, p.lanes.N())
	p.channels = make([]sink, p.lanes.N())
	for i := range p.queues {
		p.queues[i] = make(chan *laneItem, p.r.cfg.ConfirmWindow)
		ch, err := open(p.onResult)
		if err != nil {
			return fmt.Errorf("open publishing lane %d: %w", i, err)
		}
		p.channels[i] = ch
	}
	return nil
}

// onResult is every lane's Result callback: it gives the message's ticket
// its outcome in the tracker. Results come in publish order per key only
// (a lane's other keys pass a message the broker keeps nacking), and any
// order does: the tracker hands out a row as soon as it has its outcome and
// moves the position past a transaction only once all of its rows have one.
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
		// After reading, before publishing: a row read once the lease has
		// expired (this process was stopped, a standby may lead) is never
		// published by this leader.
		if !p.leader.Valid() {
			return fmt.Errorf("lane %d: %w", i, leadership.ErrLeaseExpired)
		}
		// Before the publish: the failover check must know of every
		// transaction a message of which may have reached the broker.
		p.r.failover.sent(item.tk.Record())
		if err := ch.Publish(ctx, item.msg); err != nil {
			err = fmt.Errorf("lane %d: %w", i, err)
			if ctx.Err() == nil {
				p.fail(err)
			}
			return err
		}
	}
	return nil
}

// stopReading ends reading when ctx ends (a shutdown or a pause): at once
// between transactions, else when the transaction being read commits or
// the sweep's rounds under way have committed (stop tells the sweep), or
// after ShutdownTimeout: then the cut is logged at WARN with how many
// messages will be published again.
func (p *pipeline) stopReading(ctx, readCtx context.Context) {
	select {
	case <-ctx.Done():
	case <-readCtx.Done():
		return
	}
	p.txnMu.Lock()
	p.stopping = true
	close(p.stop)
	now := !p.inTxn
	p.txnMu.Unlock()
	if now {
		p.cancelRead()
		return
	}
	t := time.NewTimer(p.r.cfg.ShutdownTimeout)
	defer t.Stop()
	timedOut, down := untilBrokerDown(p.pub, t.C, readCtx.Done())
	if !timedOut && !down {
		return // reading ended at the transaction boundary
	}
	p.txnMu.Lock()
	sweeping := p.sweeping
	p.txnMu.Unlock()
	switch {
	case sweeping: // the sweep logs its own cut, with the count of its rounds
	case down:
		p.r.log.Warn("stopping (shutdown or pause): the AMQP broker is unreachable, so reading stops now in the middle of a transaction; "+
			"the messages of its rows published so far will be published again when reading resumes",
			zap.Int64("messages", p.txnRows.Load()))
	default:
		p.r.log.Warn("stopping (shutdown or pause): the transaction being read did not end within Config.ShutdownTimeout; "+
			"reading stops now, and the messages of its rows published so far will be published again when reading resumes",
			zap.Int64("messages", p.txnRows.Load()), zap.Duration("shutdown_timeout", p.r.cfg.ShutdownTimeout))
	}
	p.cancelRead()
}

// untilBrokerDown waits for done or timeout, and returns early with down
// set once pub has no connection to the broker: nothing under way can then
// be published or confirmed, so a stop need not wait for it.
func untilBrokerDown(pub brokerLink, timeout <-chan time.Time, done <-chan struct{}) (timedOut, down bool) {
	for {
		up, changed := pub.Connected()
		if !up {
			return false, true
		}
		select {
		case <-done:
			return false, false
		case <-changed:
		case <-timeout:
			return true, false
		}
	}
}

// enterSweep is called before the sweep; false when shutdown has begun
// (reading has been stopped). leaveTxn ends it.
func (p *pipeline) enterSweep() bool {
	p.txnMu.Lock()
	defer p.txnMu.Unlock()
	if p.stopping {
		return false
	}
	p.inTxn, p.sweeping = true, true
	return true
}

// sweep delivers the rows pending before tailing with d (the sweep of the
// poll → binlog handover and of the first start). A shutdown or a pause
// (stopReading) ends it between poll rounds: the rounds under way publish,
// get their confirms and commit, so nothing is published twice, and it
// returns poller.ErrStopped unless every pending row was delivered. Rounds
// still under way after --shutdown-timeout are cut (rolled back): that is
// logged at WARN with how many messages they had published, which will be
// published again, and it returns poller.ErrStopped too.
func (p *pipeline) sweep(ctx context.Context, d drainer) (int, error) {
	if !p.enterSweep() {
		p.cancelRead()
		return 0, poller.ErrStopped
	}
	n, err := d.DrainUntil(ctx, p.stop)
	cutShort := ctx.Err() != nil // read before leaveTxn, which ends ctx on a stop
	p.txnMu.Lock()
	stopping := p.stopping
	p.txnMu.Unlock()
	p.leaveTxn()
	var cut *poller.CutError
	switch {
	case !stopping || p.leader.Err() != nil:
		return n, err
	case errors.As(err, &cut):
		p.r.log.Warn("stopping (shutdown or pause): the rounds delivering pending rows did not finish within "+
			"Config.ShutdownTimeout and were rolled back; the messages they published will be published again when the relay continues",
			zap.Int("messages", cut.Messages), zap.Int("rounds", cut.Rounds), zap.Duration("shutdown_timeout", p.r.cfg.ShutdownTimeout))
		return n, poller.ErrStopped
	case err == nil || errors.Is(err, poller.ErrStopped) || cutShort:
		// Stopped between rounds, done as the stop came, or cut before
		// its rounds had published anything.
		return n, poller.ErrStopped
	}
	return n, err
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

// leaveTxn is called after each transaction and after the sweep; on
// shutdown it stops reading.
func (p *pipeline) leaveTxn() {
	p.txnMu.Lock()
	stop := p.stopping
	p.inTxn, p.sweeping = false, false
	p.txnRows.Store(0)
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
	lane := 0
	if p.ids != nil {
		lane = p.streamLane(rec)
		if msg.Seq, err = p.nextID(lane, rec.MessageID); err != nil {
			// Never handed to a lane: end the term before anything
			// publishes this message under that id.
			p.tracker.Abandon(tk)
			p.fail(err)
			return fmt.Errorf("%w: %w", context.Canceled, err)
		}
	} else {
		lane = p.lanes.For(rec.PartitionKey)
	}
	select {
	case p.queues[lane] <- &laneItem{tk: tk, msg: msg}:
		p.txnRows.Add(1)
		return nil
	case <-ctx.Done():
		// Never handed to a lane, so never published: abandon its ticket
		// (not acknowledged, not failed) so WaitIdle does not wait for it.
		// Its transaction never resolves: Row fails, so the tailer stops
		// before its Commit.
		p.tracker.Abandon(tk)
		return ctx.Err()
	}
}
