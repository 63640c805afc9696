package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/poller"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Mode is how a relay reads the outbox: Config.Mode, and the mode a leader
// term runs in (ModeBinlog or ModePoll). Its text is what the progress row
// stores, the metrics label and the logs print.
type Mode string

// The modes of Config.Mode.
const (
	ModeAuto   Mode = "auto"   // binlog when the server allows it, else poll; switch as it changes
	ModeBinlog Mode = "binlog" // binlog only: a server that cannot serve it is a configuration error
	ModePoll   Mode = "poll"   // the SKIP LOCKED poller only
)

// modeSwitch asks the leader term to continue in another mode.
type modeSwitch struct {
	to     Mode
	reason string
	// handover: binlog mode starts with the poll → binlog handover (the
	// sweep of pending rows, then the tail from the server's position), as
	// after polling; until it is done the progress row stores mode poll, so
	// a restart in between runs it too.
	handover bool
}

// lead runs one leader term: it picks the mode and runs it, switching
// between binlog and poll as the server allows, until shutdown, leadership
// loss or a fatal error. While an operator has paused the relay it holds
// leadership and reads nothing (holdPaused); a resume starts the mode again
// from the stored checkpoint, which then holds everything published.
func (r *Relay) lead(ctx context.Context, leader lease) error {
	defer r.maintainWhileLeading(ctx, leader)()
	defer r.watchBacklog(ctx)()
	defer r.watchBroker(ctx, leader)()
	r.logCheckpoint(ctx, "resuming from the checkpoint")
	return r.runModes(ctx, leader)
}

// modeRunners runs a term's modes: New wires the Relay's own (startMode,
// runBinlog, runPoll); the unit tests put fakes in their place.
type modeRunners struct {
	start  func(ctx context.Context) (Mode, string)
	binlog func(ctx context.Context, leader lease) (*modeSwitch, error)
	poll   func(ctx context.Context, leader lease) (*modeSwitch, error)
}

// runModes is lead's loop: it picks the mode, records it, runs it until it
// ends or asks to switch, and holds an operator's pause in between.
func (r *Relay) runModes(ctx context.Context, leader lease) error {
	var (
		mode     Mode
		reason   string
		handover bool
	)
	for {
		paused, changed := leader.Paused()
		if paused {
			if err := r.holdPaused(ctx, leader); err != nil || ctx.Err() != nil {
				return err
			}
			// Choose the mode afresh: the operator may have moved the
			// checkpoint (which stores mode binlog) while paused.
			r.logCheckpoint(ctx, "resumed by an operator; continuing from the checkpoint")
			mode = ""
			continue
		}
		if mode == "" {
			mode, reason = r.modes.start(ctx)
			handover = false
		}
		if err := r.enterMode(ctx, leader, mode, reason, handover); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		next, pausing, err := r.runMode(ctx, leader, mode, changed)
		switch {
		case err != nil:
			return err
		case pausing:
			continue
		case next == nil:
			return nil
		}
		mode, reason, handover = next.to, next.reason, next.handover
	}
}

// enterMode announces mode (log, metrics, Config.OnMode) and stores it in
// the progress row with why; handover: binlog mode is to start with the
// handover (modeSwitch).
func (r *Relay) enterMode(ctx context.Context, leader lease, mode Mode, reason string, handover bool) error {
	logMode := r.log.Info
	if mode == ModePoll && r.cfg.Mode == ModeAuto {
		// A fallback: the reason lists what keeps binlog mode off and
		// how to fix each.
		logMode = r.log.Warn
	}
	logMode("mode", zap.String("mode", string(mode)), zap.String("reason", reason))
	r.modeReason.Store(reason)
	r.cfg.Metrics.SetMode(string(mode))
	if mode == ModePoll {
		r.cfg.Metrics.SetRetentionHeadroom(math.NaN()) // no binlog position to lose
	}
	if r.cfg.OnMode != nil {
		r.cfg.OnMode(mode, reason)
	}
	var stored Mode
	if mode == ModePoll || handover {
		// Stored at once: a restart after polling must run the poll →
		// binlog handover rather than trust the old binlog position.
		stored = ModePoll
	}
	return r.progress.SetMode(ctx, leader.Epoch(), string(stored), "mode "+string(mode)+": "+reason)
}

// runMode runs mode until it ends (next nil), asks to switch (next), fails,
// or an operator's pause (pauseChanged closes) stops it: pausing. A pause
// ends the mode as a shutdown does: reading stops at a transaction boundary
// (binlog) or after the rounds under way (poll), and what was published is
// confirmed and acknowledged.
func (r *Relay) runMode(ctx context.Context, leader lease, mode Mode, pauseChanged <-chan struct{}) (next *modeSwitch, pausing bool, err error) {
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan struct{})
	defer func() { stopRun(); <-done }() // the pause watch ends with the mode
	go func() {
		defer close(done)
		select {
		case <-pauseChanged:
			stopRun()
		case <-runCtx.Done():
		}
	}()
	if mode == ModePoll {
		next, err = r.modes.poll(runCtx, leader)
	} else {
		next, err = r.modes.binlog(runCtx, leader)
		r.failover.save()               // what moved after the state file writer's last write
		r.cfg.Metrics.SetInflight(0, 0) // the pipeline has ended: nothing of it is in flight
	}
	return next, runCtx.Err() != nil && ctx.Err() == nil, err
}

// startMode picks the first mode of a term.
func (r *Relay) startMode(ctx context.Context) (mode Mode, reason string) {
	switch r.cfg.Mode {
	case ModePoll:
		return ModePoll, "--mode poll"
	case ModeBinlog:
		return ModeBinlog, "--mode binlog"
	}
	if err := r.binlog.Preflight(ctx); err != nil {
		return ModePoll, "binlog unavailable: " + err.Error()
	}
	return ModeBinlog, "the server serves the binlog"
}

// fallbackReason says whether err from the binlog pipeline should send an
// auto relay to poll mode, and why. These are the errors retrying the
// binlog cannot fix but polling can work around: the binlog cannot be read
// (purged, access, TLS, settings), or it holds outbox rows it cannot give
// as committed rows (a table map without a contract column, a
// statement-logged write: the rows are in the table, which polling reads),
// or the table lacks a column the sweep reads (polling waits for it). A
// *canal.DivergedError is not among them: restarting the term from the
// durable checkpoint cures it.
func (r *Relay) fallbackReason(err error) string {
	if r.cfg.Mode != ModeAuto || err == nil {
		return ""
	}
	var (
		purged *canal.PurgedError
		access *canal.AccessError
		tlsErr *canal.TLSError
		pre    *canal.PreflightError
		cfgErr *ConfigError
		schema *canal.SchemaError
		stmt   *canal.StatementError
	)
	switch {
	case errors.As(err, &purged), errors.As(err, &access), errors.As(err, &tlsErr), errors.As(err, &pre), errors.As(err, &cfgErr):
		return err.Error()
	case errors.As(err, &schema):
		return err.Error() + "; polling delivers the rows by the table's column names (it waits while a column is missing), " +
			"then the handover returns to the binlog past this transaction"
	case errors.As(err, &stmt):
		return err.Error() + "; polling delivers those rows, then the handover returns to the binlog past this transaction " +
			"(set binlog_format=ROW for the sessions writing the outbox)"
	case unknownColumn(err):
		return "the outbox table lacks a column the relay reads: " + err.Error()
	}
	return ""
}

// detour says whether err from the binlog pipeline, which would otherwise
// end the term, asks to go on in another mode: poll mode (fallbackReason),
// or, for the XA COMMIT of a transaction whose outbox rows the binlog holds
// at its XA PREPARE (in every mode), binlog mode again through the
// handover, whose sweep delivers those rows from the table and whose tail
// starts past the commit. Nil: no detour.
func (r *Relay) detour(err error) *modeSwitch {
	var xa *canal.XACommitError
	if errors.As(err, &xa) {
		return &modeSwitch{to: ModeBinlog, handover: true,
			reason: err.Error() + "; the handover's sweep delivers them, then the binlog is tailed past the commit"}
	}
	if why := r.fallbackReason(err); why != "" {
		return &modeSwitch{to: ModePoll, reason: why}
	}
	return nil
}

// unknownColumn reports MySQL error 1054 (unknown column): a statement of
// the relay names a column the outbox table lacks now.
func unknownColumn(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1054
}

// troubleWatch decides, from the tailer's reconnect attempts, when binlog
// trouble has lasted longer than --fallback-after while the database still
// answers; it then calls stop once with the reason.
//
// The trouble starts at the first failure after the stream last made
// progress (attempt 1: the tailer counts failures since it last yielded a
// row or a transaction) and ends only with progress. A connection that hangs
// until the read timeout is trouble however long it lives. A healthy stream
// always progresses: the leader's heartbeat is a transaction every few
// seconds.
type troubleWatch struct {
	r    *Relay
	stop func(reason string)
	// ping reaches the database (the Relay's pool): polling helps only
	// while it answers.
	ping  func(ctx context.Context) error
	mu    sync.Mutex
	since time.Time // the first failure since the last progress
	fired bool
}

func (w *troubleWatch) onRetry(err error, attempt int) {
	w.r.backlog.trouble.Store(time.Now().UnixNano()) // the backlog is unknown until the stream moves again
	w.mu.Lock()
	defer w.mu.Unlock()
	if attempt == 1 || w.since.IsZero() {
		w.since = time.Now()
	}
	if w.fired || w.r.cfg.Mode != ModeAuto || time.Since(w.since) < w.r.cfg.FallbackAfter {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if w.ping(ctx) != nil {
		return // the database is down too: polling would not help
	}
	w.fired = true
	w.stop(fmt.Sprintf("binlog unreadable for %s while the database answers: %v",
		time.Since(w.since).Round(time.Second), err))
}

// runPoll delivers with the poller until shutdown or leadership loss; in auto
// mode it re-probes the binlog every --binlog-retry-interval and hands over
// to binlog mode when the server serves it again.
func (r *Relay) runPoll(ctx context.Context, leader lease) (*modeSwitch, error) {
	// pollCtx outlives ctx: on shutdown the rounds under way commit (bounded
	// by ShutdownTimeout) so a clean stop repeats nothing; it ends at once
	// when leadership is lost.
	pollCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	go func() {
		select {
		case <-leader.Lost():
			cancel()
		case <-pollCtx.Done():
		}
	}()
	// A promoted replica, or a VIP that moved, may lack what was published
	// (in binlog mode, by this or an earlier term): polling it would hide
	// the loss. Checked on every poll term, before anything is published.
	progress, err := r.progress.Load(pollCtx)
	if err != nil {
		return nil, err
	}
	if _, err := r.failover.checkNotLost(pollCtx, progress.Position); err != nil {
		return nil, err
	}
	if err := r.waitShape(ctx, leader); err != nil || ctx.Err() != nil {
		return nil, err
	}
	publisher, p, err := r.openPoll(pollCtx, leader)
	if err != nil {
		return nil, err
	}
	defer r.closeLogged("poll mode's publisher", publisher)
	r.tailing.Store(false)
	r.clearFailed(ctx, leader.Epoch()) // before the flag: whoever sees it sees the status cleared
	r.polling.Store(true)
	defer r.polling.Store(false)
	// Logged after the flag: whoever reads this line sees /readyz answer 200.
	r.log.Info("polling the outbox table")
	stop := make(chan struct{})
	done := make(chan error, 1)
	// A round that finds the lease expired has ended leadership through
	// Valid: pollCtx ends with it.
	go func() { done <- p.RunUntil(pollCtx, stop) }()

	var probe <-chan time.Time
	if r.cfg.Mode == ModeAuto {
		t := time.NewTicker(r.cfg.BinlogRetryInterval)
		defer t.Stop()
		probe = t.C
	}
	for {
		select {
		case <-ctx.Done():
			if err := r.stopRounds(ctx, publisher, stop, done, cancel); err != nil && !errors.Is(err, context.Canceled) {
				return nil, err
			}
			return nil, nil
		case err := <-done:
			if lost := leader.Err(); lost != nil {
				return nil, lost
			}
			if shapeChanged(err) {
				return &modeSwitch{to: ModePoll, reason: "the outbox table's columns changed: " + err.Error()}, nil
			}
			return nil, err
		case <-probe:
			if err := r.binlogReady(pollCtx); err != nil {
				r.log.Debug("binlog still unavailable", zap.Error(err))
				continue
			}
			// Let the rounds under way commit: what they published must
			// not be published again by the handover's drain.
			if err := r.stopRounds(ctx, publisher, stop, done, cancel); err != nil && !errors.Is(err, context.Canceled) {
				return nil, err
			}
			if lost := leader.Err(); lost != nil {
				return nil, lost
			}
			if ctx.Err() != nil {
				return nil, nil
			}
			return &modeSwitch{to: ModeBinlog, reason: "the binlog is readable again"}, nil
		}
	}
}

// binlogReady is the auto relay's probe while polling: the server serves
// the binlog (Preflight) and the relay's tables have every column the
// handover's sweep reads (else the sweep would fail, or the binlog's table
// maps still lack a contract column).
func (r *Relay) binlogReady(ctx context.Context) error {
	if err := r.binlog.Preflight(ctx); err != nil {
		return err
	}
	return r.tablesShape(ctx)
}

// stopRounds closes stop and waits until the poller (RunUntil, ending on
// done) has let its rounds under way commit, so nothing they published is
// published again. Once ctx has ended (a shutdown or a pause) it waits at
// most --shutdown-timeout, and not at all while pub has no connection to
// the broker (no confirm can arrive: what the rounds sent is published
// again whatever the wait); then it cuts the rounds (cancel ends the
// poller's context, which rolls them back) and logs how many messages they
// had published: those will be published again. It returns the poller's
// error, nil after a cut.
func (r *Relay) stopRounds(ctx context.Context, pub brokerLink, stop chan<- struct{}, done <-chan error, cancel context.CancelFunc) error {
	close(stop)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	t := time.NewTimer(r.cfg.ShutdownTimeout)
	defer t.Stop()
	timedOut := false
	for wait := true; wait; {
		up, changed := pub.Connected()
		if !up {
			break
		}
		select {
		case err := <-done:
			return err
		case <-changed:
		case <-t.C:
			timedOut, wait = true, false
		}
	}
	cancel()
	var cut *poller.CutError
	if !errors.As(<-done, &cut) {
		cut = &poller.CutError{}
	}
	switch {
	case timedOut:
		r.log.Warn("stopping (shutdown or pause): poll rounds under way did not finish within Config.ShutdownTimeout "+
			"and were rolled back; the messages they published will be published again when the relay continues",
			zap.Int("messages", cut.Messages), zap.Int("rounds", cut.Rounds), zap.Duration("shutdown_timeout", r.cfg.ShutdownTimeout))
	case cut.Rounds > 0:
		r.log.Warn("stopping (shutdown or pause): the AMQP broker is unreachable, so poll rounds under way were rolled back "+
			"at once; the messages they published will be published again when the relay continues",
			zap.Int("messages", cut.Messages), zap.Int("rounds", cut.Rounds))
	}
	return nil
}

// openPolling is poll mode's openPoll: a publisher, and a poller of
// leader's term on it.
func (r *Relay) openPolling(ctx context.Context, leader lease) (pollPublisher, rounds, error) {
	pub, err := r.newPublisher(ctx)
	if err != nil {
		return nil, nil, err
	}
	p, err := r.newPoller(poller.AMQP(pub), leader)
	if err != nil {
		pub.Close()
		return nil, nil, err
	}
	return pub, p, nil
}

func (r *Relay) newPublisher(ctx context.Context) (*publish.Publisher, error) {
	pub, err := publish.New(ctx, publish.Config{
		URL: r.cfg.AMQPURL, Conn: r.cfg.AMQPOptions, ConfirmWindow: r.cfg.ConfirmWindow, MaxAttempts: r.cfg.MaxAttempts,
		MaxMessageSize: r.cfg.AMQPMaxMessageSize,
		// The tracker bounds what every lane holds together, parked
		// messages included: a lane never needs more.
		MaxHeldBytes: r.cfg.MaxInflightBytes,
		Logger:       r.log.Named("publish"),
		Tracer:       r.cfg.Tracer,
		OnReconnect:  func(node string) { r.cfg.Metrics.ReconnectedTo(metrics.TargetAMQP, node) },
		// A broker that refuses (login, vhost, TLS) or cannot be reached
		// is retried while the relay keeps leadership; each failed attempt
		// is counted and is the readiness reason until a dial succeeds.
		RetryRefused: true,
		OnDial: func(node string, err error) {
			if err == nil {
				r.state.setBrokerDown("")
				return
			}
			r.cfg.Metrics.ReconnectedTo(metrics.TargetAMQP, node)
			r.state.setBrokerDown("cannot publish: " + err.Error())
		},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	r.state.setPublisher(pub)
	return pub, nil
}

// newPoller returns a poller of leader's term. Every round checks
// leader.Valid between its claim and its first publish
// (poller.Config.Leading): one that finds the lease expired is rolled back
// unpublished and ends the call with leadership.ErrLeaseExpired.
func (r *Relay) newPoller(pub poller.Publisher, leader lease) (*poller.Poller, error) {
	p, err := poller.New(r.db, pub, r.store, leader.Epoch(), poller.Config{
		Table: r.cfg.Table, OnDelivered: r.cfg.OnDelivered, Interval: r.cfg.PollInterval,
		Batch: r.cfg.PollBatch, Workers: r.cfg.PollWorkers, DefaultExchange: r.cfg.DefaultExchange,
		Logger: r.log.Named("poller"), Metrics: r.cfg.Metrics, Leading: leader.Valid,
	})
	if err != nil {
		return nil, &ConfigError{err}
	}
	return p, nil
}

// closeLogged closes c, what a mode opened for its run, when the run ends,
// and logs its error: the run's own end is decided by then, and a close
// that fails (a stream connection that did not close in time, a producer
// the broker had already dropped) says something about the broker, not the
// delivery. what names c in the log line.
func (r *Relay) closeLogged(what string, c io.Closer) {
	if err := c.Close(); err != nil {
		r.log.Warn("close "+what+" failed", zap.Error(err))
	}
}
