package replay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/internal/mysqlconn"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Run replays cfg.Range and returns what it did. The error is nil when every
// message was published and confirmed (dry run: counted); a *RefusedError
// when the request or the server rules the replay out (nothing was
// published); ctx.Err() when ctx ended first; an error naming the count when
// messages were not confirmed; another error for a runtime failure. The
// Summary is non-nil whenever the stream started, also with an error.
//
// Run reads the database (positions, binlog files, the relay's epoch) and
// the binlog, and writes nothing to the database.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	db, ccfg, err := open(cfg)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	tailer, flavor, err := newTailer(ctx, db, ccfg)
	if err != nil {
		return nil, err
	}
	b, err := resolve(ctx, db, tailer, flavor, cfg.Range, log)
	if err != nil {
		return nil, err
	}
	epoch, err := relayEpoch(ctx, db, cfg.RelayName)
	if err != nil {
		return nil, err
	}
	log.Info("replaying", zap.Stringer("after", b.from), zap.Stringer("up_to", b.to),
		zap.Stringer("server_position", b.limit), zap.Bool("dry_run", cfg.DryRun),
		zap.Uint32("server_id", cfg.ServerID), zap.Int64("epoch", epoch))

	st, err := newStream(&cfg, b, epoch)
	if err != nil {
		return nil, err
	}
	st.s.From, st.s.To, st.s.Empty, st.s.FromTime = b.from, b.to, b.empty, b.fromTime
	st.started = time.Now()
	if b.empty {
		return st.finish(nil), nil
	}
	if !cfg.DryRun {
		pub, err := st.openChannels(ctx, &cfg)
		if err != nil {
			return nil, err
		}
		defer pub.Close()
	}
	runErr := st.tail(ctx, tailer, b.from)
	var pe *canal.PurgedError
	if errors.As(runErr, &pe) {
		// The server refuses the dump before sending anything: a refused
		// run, without a summary.
		return nil, unknownStart(ctx, db, flavor, b, pe)
	}
	if err := st.flush(ctx); err != nil && runErr == nil {
		runErr = err
	}
	s := st.finish(runErr)
	if runErr == nil && s.NotConfirmed() > 0 && !cfg.DryRun {
		runErr = fmt.Errorf("replay: %d of %d messages were not confirmed (%d returned, %d rejected, %d invalid, %d without an outcome)",
			s.NotConfirmed(), s.Messages+s.Invalid, s.Returned, s.Rejected, s.Invalid, s.Unconfirmed)
	}
	return s, runErr
}

// newTailer checks that the server can serve its binlog to ccfg (a server
// or TLS setup that cannot is a *RefusedError) and returns a tailer of it
// with the server's flavor.
func newTailer(ctx context.Context, db *sql.DB, ccfg canal.Config) (*canal.Tailer, string, error) {
	if err := canal.Preflight(ctx, db, ccfg); err != nil {
		var pe *canal.PreflightError
		var te *canal.TLSError
		switch {
		case errors.As(err, &pe):
			return nil, "", &RefusedError{fmt.Errorf("replay: the server cannot serve the binlog: %w", err)}
		case errors.As(err, &te):
			return nil, "", &RefusedError{fmt.Errorf("replay: %w", te)}
		}
		if te := canal.ExplainConnectError(ctx, ccfg, err); te != err {
			return nil, "", &RefusedError{fmt.Errorf("replay: %w", te)}
		}
		return nil, "", fmt.Errorf("replay: preflight: %w", err)
	}
	flavor, err := canal.DetectFlavor(ctx, db)
	if err != nil {
		return nil, "", fmt.Errorf("replay: %w", err)
	}
	ccfg.Flavor = flavor
	tailer, err := canal.New(ccfg)
	if err != nil {
		return nil, "", &RefusedError{fmt.Errorf("replay: %w", err)}
	}
	return tailer, flavor, nil
}

// openChannels checks the broker and opens the publisher with cfg.Lanes
// channels for st. The publisher outlives ctx so that an interrupted replay
// still waits (FlushTimeout) for the confirms of what it published; the
// caller closes it.
func (st *stream) openChannels(ctx context.Context, cfg *Config) (*publish.Publisher, error) {
	if err := checkBroker(ctx, cfg.AMQPURL, cfg.AMQPOptions, cfg.Exchange); err != nil {
		return nil, err
	}
	pub, err := publish.New(context.WithoutCancel(ctx), publish.Config{
		URL: cfg.AMQPURL, Conn: cfg.AMQPOptions, ConfirmWindow: cfg.ConfirmWindow, MaxAttempts: cfg.MaxAttempts,
		Logger: cfg.Logger.Named("publish"),
	})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	for range cfg.Lanes {
		ch, err := pub.NewChannel(st.onResult)
		if err != nil {
			pub.Close()
			return nil, fmt.Errorf("replay: %w", err)
		}
		st.chans = append(st.chans, ch)
	}
	return pub, nil
}

// tail streams the binlog from from into st, reporting progress meanwhile,
// until the range ends (nil), ctx ends (the summary says interrupted) or
// reading fails. A *canal.PurgedError is returned as it is: the server
// refused the dump before sending anything.
func (st *stream) tail(ctx context.Context, tailer *canal.Tailer, from position.Position) error {
	stop, reported := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(reported)
		st.report(stop)
	}()
	err := tailer.Run(ctx, from, st)
	close(stop)
	<-reported
	var pe *canal.PurgedError
	switch {
	case errors.Is(err, errDone):
		return nil
	case ctx.Err() != nil:
		st.count(func(s *Summary) { s.Interrupted = true })
		return fmt.Errorf("replay interrupted: %w", ctx.Err())
	case errors.As(err, &pe):
		return err
	case err != nil:
		return fmt.Errorf("replay: read the binlog: %w", err)
	}
	return nil
}

// flush waits until every published message has its outcome: while ctx
// lives, then at most FlushTimeout more.
func (st *stream) flush(ctx context.Context) error {
	wait := func(ctx context.Context) error {
		for _, ch := range st.chans {
			if err := ch.Flush(ctx); err != nil {
				return err
			}
		}
		return nil
	}
	if ctx.Err() == nil {
		err := wait(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil {
			return fmt.Errorf("replay: wait for confirms: %w", err)
		}
	}
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), st.cfg.FlushTimeout)
	defer cancel()
	if err := wait(gctx); err != nil {
		return fmt.Errorf("replay: wait for confirms: %w", err)
	}
	return nil
}

// finish completes the Summary and sends the final Progress.
func (st *stream) finish(runErr error) *Summary {
	st.mu.Lock()
	st.s.ReadUpTo = st.pos
	st.s.PartialMessages = st.txnMsgs
	st.s.Elapsed = time.Since(st.started)
	if !st.s.DryRun {
		st.s.Unconfirmed = max(0, st.s.Messages-st.s.Confirmed-st.s.Returned-st.s.Rejected)
	}
	st.s.Routes = sortedRoutes(st.routes)
	if st.firstCur != "" {
		st.s.FirstGTID = addedGTID(st.b.flavor, st.firstPrev, st.firstCur)
		st.s.LastGTID = addedGTID(st.b.flavor, st.lastPrev, st.lastCur)
	}
	s := st.s
	st.mu.Unlock()
	if st.cfg.OnProgress != nil && !st.b.empty {
		st.cfg.OnProgress(st.progress(0, 0, runErr == nil))
	}
	return &s
}

// open opens the database pool and derives the binlog connection, both with
// cfg's TLS settings and password.
func open(cfg Config) (*sql.DB, canal.Config, error) {
	target, err := mysqlconn.New(cfg.mysqlOptions()) // Validate checked it
	if err != nil {
		return nil, canal.Config{}, refused("replay: %v", err)
	}
	db, err := target.OpenDB(mysqlconn.DialTimeout)
	if err != nil {
		return nil, canal.Config{}, refused("replay: %v", err)
	}
	db.SetMaxOpenConns(2)
	cc := target.Binlog()
	cc.ServerID, cc.Table, cc.Logger = cfg.ServerID, cfg.Table, cfg.Logger
	return db, cc, nil
}

// relayEpoch is the relay's current epoch from its progress row, 0 when it
// has none (no row, no table). Read only.
func relayEpoch(ctx context.Context, db *sql.DB, name string) (int64, error) {
	var epoch int64
	err := db.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ?", name).Scan(&epoch)
	var me *mysql.MySQLError
	switch {
	case errors.Is(err, sql.ErrNoRows), errors.As(err, &me) && me.Number == 1146: // no such table
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("replay: read the epoch of relay %q: %w", name, err)
	}
	return epoch, nil
}

// checkBroker fails a replay whose broker cannot be reached now (the
// publisher would wait for it in silence), refuses one that refuses the
// login or the TLS handshake (a configuration to fix), and refuses an
// --exchange that does not exist (every message would come back). urls
// may list a cluster's nodes: the first that answers is checked.
func checkBroker(ctx context.Context, urls string, opts publish.ConnOptions, exchange string) error {
	conn, _, err := publish.DialAny(ctx, urls, opts, "outbox-relay replay check")
	if publish.IsRefused(err) {
		return &RefusedError{fmt.Errorf("replay: %w", err)}
	}
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	defer conn.Close()
	if exchange == "" {
		return nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("replay: check exchange %q: %w", exchange, err)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclarePassive(exchange, "topic", true, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return refused("replay: exchange %q does not exist on the broker", exchange)
		}
		return fmt.Errorf("replay: check exchange %q: %w", exchange, err)
	}
	return nil
}

// unknownStart is the refusal of a start the server would not stream from
// although CheckPosition let it pass (a GTID of a server id or domain the
// server never logged, or one beyond its history): it names the start, the
// server's reason, and the oldest and newest positions to choose from.
func unknownStart(ctx context.Context, db *sql.DB, flavor string, b bounds, pe *canal.PurgedError) error {
	oldest, err := oldestPosition(ctx, db, flavor, "")
	if err != nil {
		return err
	}
	return refused("replay: the start %s is not in the server's binlog history: it was never logged by this server "+
		"(another server, or a domain or sequence number this server never wrote) or its binlogs were purged (server: %s); "+
		"the oldest position available is %s%s, the newest is %s; give a start between them",
		describe(b.from), pe.Detail, describe(oldest), orGTID(oldest), describe(b.limit))
}
