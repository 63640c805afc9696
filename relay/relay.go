package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/internal/backoff"
	"github.com/outbox-relay/outbox-relay/internal/mysqlconn"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/streams"
)

// ConfirmStallAfter is how long the publisher may wait for the broker's
// confirmations, with messages on the wire, before the relay reports itself
// not ready. The messages are not given up: they stay in flight (and in the
// outbox) until the broker confirms them, or are published again after a
// reconnect.
const ConfirmStallAfter = 10 * time.Second

// Relay publishes one outbox table's rows to RabbitMQ.
type Relay struct {
	cfg   Config
	log   *zap.Logger
	db    *sql.DB
	store *checkpoint.Store // status FAILED, errors, broker; the poller's store
	// elector takes leadership and keeps this process's instances row.
	elector *leadership.Elector
	// progress is store as a leader term's modes use it (the seam the
	// unit tests fill with a fake).
	progress   progressStore
	canal      canal.Config
	binlog     binlogServer // what binlog mode reads: canalBinlog, on canal
	openBinlog openBinlog   // binlog mode's publisher: openBinlogPub
	openPoll   openPoll     // poll mode's publisher and poller: openPolling
	modes      modeRunners  // the modes a term runs
	// tablesShape checks that the relay's tables have every column it
	// reads and writes (migrations.Current in production).
	tablesShape func(ctx context.Context) error
	// readSettings reads the server's global binlog settings
	// (canal.ReadSettings in production; nil: not watched).
	readSettings func(ctx context.Context) (canal.Settings, error)

	modeReason atomic.Value // string: why the term entered its current mode (enterMode)

	tailing atomic.Bool // leading, and reading the binlog past the first-start sweep
	polling atomic.Bool // leading in poll mode
	paused  atomic.Bool // leading a relay an operator paused, stopped
	backlog backlogHint // what binlog mode knows of the backlog, for the backlog watch (backlog.go)

	// state is why the relay is not ready, its broker trouble and the
	// term's publisher, for Ready and BrokerNode.
	state supervisorState

	// failover is what this process has published, kept across
	// reconnects and leader terms, and the check that compares it with
	// every server it resumes on.
	failover *failoverCheck

	// The stream destination (streamdest.go): streamIssued is the highest
	// publishing id this process gave each producer name, across terms;
	// serverIdentity reads the identity of the database server (its
	// server_uuid, or server_id), stored with the ids; streamServer is the
	// current term's (string), which a reconnected binlog stream must
	// still reach (checkStreamServer). streamDumpID is the term server's
	// server_id, which every binlog dump's own events must carry, the
	// first dump's included (checkDumpServer; 0: unchecked);
	// streamDumpSaw is the other server_id a dump of an ended term
	// carried, for the next term's decision (decideStreamIDs).
	streamIssued *streams.Issued
	// streamSent is the message each id this process gave was given to
	// (streamcarry.go), for carrying the ids over to another server.
	streamSent     sentIDs
	serverIdentity func(ctx context.Context) (serverIdent, error)
	streamServer   atomic.Value
	streamDumpID   atomic.Uint32
	streamDumpSaw  atomic.Uint32

	// serverIDUnchecked logs once per process that the binlog preflight
	// could not check --server-id (it runs again at every re-probe).
	serverIDUnchecked sync.Once
}

// Ready is nil when the relay does its job: it leads and delivers (tails the
// binlog or polls) or holds an operator's pause, or it is a standby whose
// last attempt at leadership reached the database, and its broker
// connection is not failing. Otherwise it says what is wrong. No I/O:
// /readyz calls it.
func (r *Relay) Ready() error {
	notReady, brokerDown, pub := r.state.get()
	if brokerDown != "" {
		return errors.New(brokerDown)
	}
	if pub != nil && !r.Paused() {
		if wait := pub.ConfirmWait(); wait > ConfirmStallAfter {
			return fmt.Errorf("no publisher confirms from RabbitMQ node %s for %v (a quorum queue without a majority of its nodes, "+
				"or an overloaded broker): the messages are held, not given up, and go on when the broker confirms again",
				pub.Node(), wait.Round(time.Second))
		}
	}
	if r.Tailing() || r.Polling() || r.Paused() {
		return nil
	}
	if notReady != "" {
		return errors.New(notReady)
	}
	return nil
}

// BrokerNode is the RabbitMQ node (host:port of one of --amqp-url's URLs,
// never with credentials) the leader's publisher is connected to, "" when
// it is not connected or the relay does not lead. No I/O.
func (r *Relay) BrokerNode() string {
	if _, _, pub := r.state.get(); pub != nil && !r.Paused() {
		return pub.Node()
	}
	return ""
}

// Paused reports whether the relay leads and holds a pause an operator
// asked for: it reads and publishes nothing until `resume`. A paused relay
// is ready: it does what it was told.
func (r *Relay) Paused() bool { return r.paused.Load() }

// Polling reports whether the relay leads in poll mode.
func (r *Relay) Polling() bool { return r.polling.Load() }

// Tailing reports whether the relay leads and is reading the binlog live: any
// row committed from now on is published from the binlog stream.
func (r *Relay) Tailing() bool { return r.tailing.Load() }

// New fills cfg's defaults, validates it and opens the database pool; it
// does not connect yet.
func New(cfg Config) (*Relay, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	target, err := mysqlconn.New(cfg.mysqlOptions())
	if err != nil {
		return nil, &ConfigError{err}
	}
	connector, err := target.Connector(mysqlconn.UTC)
	if err != nil {
		return nil, &ConfigError{err}
	}
	db := sql.OpenDB(&rowImageConnector{Connector: connector, log: cfg.Logger})
	// A leader holds two (its lock, its heartbeat) for its term, and each
	// poll worker one for its call (poller.New), as does the due-time
	// sweeper: seven besides the poll workers.
	open := 7 + cfg.PollWorkers
	db.SetMaxOpenConns(open)
	// As many idle as open: the acker and the rest would otherwise
	// reconnect (handshake, SET time_zone) on every use.
	db.SetMaxIdleConns(open)
	db.SetConnMaxIdleTime(time.Minute)

	store, err := checkpoint.New(db, checkpoint.Config{
		RelayName: cfg.RelayName, Table: cfg.Table, OnDelivered: cfg.OnDelivered,
	})
	if err != nil {
		db.Close()
		return nil, &ConfigError{err}
	}
	elector, err := leadership.New(db, leadership.Config{
		RelayName: cfg.RelayName, Table: cfg.Table, Instance: cfg.Instance, HeartbeatInterval: cfg.HeartbeatInterval,
		LeaderLease: cfg.LeaderLease, Logger: cfg.Logger,
	})
	if err != nil {
		db.Close()
		return nil, &ConfigError{err}
	}
	var state *stateFile
	if cfg.StateFile != "" {
		state = &stateFile{path: cfg.StateFile, relayName: cfg.RelayName}
	}
	cc := target.Binlog()
	cc.ServerID, cc.Table, cc.Logger = cfg.ServerID, cfg.Table, cfg.Logger.Named("canal")
	r := &Relay{cfg: cfg, log: cfg.Logger, db: db, store: store, elector: elector, progress: store, canal: cc}
	r.modes = modeRunners{start: r.startMode, binlog: r.runBinlog, poll: r.runPoll}
	r.binlog = canalBinlog{r: r}
	r.openPoll = r.openPolling
	r.tablesShape = func(ctx context.Context) error { return migrations.Current(ctx, r.db, r.cfg.Table) }
	r.readSettings = func(ctx context.Context) (canal.Settings, error) { return canal.ReadSettings(ctx, r.db) }
	r.openBinlog = r.openBinlogPub
	r.streamIssued = streams.NewIssued()
	r.streamSent.keepFor = sentKeep
	r.serverIdentity = func(ctx context.Context) (serverIdent, error) { return serverIdentity(ctx, r.db) }
	if cfg.Stream.Enabled() {
		r.openBinlog = r.openStreamPub
		r.openPoll = r.openStreamPolling
	}
	r.failover = &failoverCheck{log: cfg.Logger, accept: cfg.AcceptLostGTIDs, state: state,
		server: dbServer{db: db, addr: func() string { return r.canal.Host + ":" + strconv.Itoa(r.canal.Port) }}}
	r.canal.OwnServerID = elector.Led
	r.canal.OnServerIDUnchecked = func(reason string) {
		r.serverIDUnchecked.Do(func() { r.log.Named("canal").Info("preflight: " + reason) })
	}
	return r, nil
}

// Close releases the database pool.
func (r *Relay) Close() error { return r.db.Close() }

// Run relays until ctx ends (then it shuts down cleanly and returns nil) or a
// fatal error: a *ConfigError for setup problems retrying cannot fix (binlog
// settings, grants, purged checkpoint, a live leader of another relay name
// on the same outbox table: leadership.ErrTableLed, a leader of this relay
// name for another database of the server: leadership.ErrNameTaken),
// another error for a
// runtime failure.
// Transient trouble — database or broker down, leadership lost — is retried
// with backoff, resuming from the durable checkpoint.
//
// The process keeps a row of outbox_relay_instances for `status`: a standby
// beats it each time it looks for leadership (every StandbyRetry at most), a
// leader once per term, and Run deletes it when it returns.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.failover.load(); err != nil {
		return err
	}
	if err := r.preflight(ctx); err != nil {
		r.markFailed(ctx, 0, err)
		return err
	}
	r.state.setNotReady("starting")
	m := r.cfg.Metrics
	row := &instanceRow{r: r}
	defer row.remove(ctx)
	retry := &backoff.Counter{Min: 200 * time.Millisecond, Max: 10 * time.Second}
	// A standby says so once at INFO, then at DEBUG at every look, until
	// it leads (and stands by again) or the leader changes.
	lastLeader := ""
	// A standby waits for the lock inside its next look (a leader that
	// stops or dies frees it, and the standby takes it at once): one
	// statement per look.
	var wait time.Duration
	for {
		leader, err := r.elector.AcquireWithin(ctx, wait)
		wait = 0
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, leadership.ErrHeld):
			wait = r.standBy(ctx, err, row, &lastLeader)
			continue
		case errors.Is(err, leadership.ErrTableLed), errors.Is(err, leadership.ErrNameTaken):
			// Another relay name leads the table (leading too would
			// publish every row twice), or this name is led for another
			// database of the server (its lock is the server's): waiting
			// would hide the misconfiguration. The one already leading
			// keeps leading.
			err = &ConfigError{err}
			r.state.setNotReady(err.Error())
			r.markFailed(ctx, 0, err)
			return err
		case err != nil:
			d := retry.Next()
			r.state.setNotReady("cannot reach the database to take leadership: " + err.Error())
			m.Reconnected(metrics.TargetMySQL)
			r.log.Warn("cannot take leadership, retrying", zap.Error(err), zap.Duration("in", d))
			if !backoff.Sleep(ctx, d) {
				return nil
			}
			continue
		}
		lastLeader = ""
		if stop, err := r.term(ctx, leader, row, retry); stop {
			return err
		}
	}
}

// standBy records that another instance leads (err, an ErrHeld) and
// returns how long the next look may wait for the lock: at most
// StandbyRetry (4/5 of the lease by default) between two looks, so this
// standby's heartbeat in outbox_relay_instances stays inside the lease
// (status shows it alive), and not past the moment the leader's lease
// would end without another heartbeat (AcquireWithin). lastLeader is the
// leader last named at INFO.
func (r *Relay) standBy(ctx context.Context, err error, row *instanceRow, lastLeader *string) time.Duration {
	r.state.setNotReady("")
	r.cfg.Metrics.SetMode("")
	row.beat(ctx, leadership.RoleStandby)
	var held *leadership.HeldError
	if errors.As(err, &held) {
		log := r.log.Debug
		if held.Leader != *lastLeader {
			log, *lastLeader = r.log.Info, held.Leader
		}
		log("standby: another instance leads this relay name", zap.String("relay", r.cfg.RelayName),
			zap.String("leader", held.Leader), zap.Duration("heartbeat_age", held.Age))
	}
	return min(r.cfg.StandbyRetry, r.cfg.LeaderLease*4/5)
}

// term leads one leader term until it ends and releases leadership. stop
// tells Run to return err: on shutdown (err nil) or a fatal error (the
// relay is marked FAILED). Otherwise the error is recorded and term waits
// out the retry backoff before the next look.
func (r *Relay) term(ctx context.Context, leader *leadership.Leader, row *instanceRow, retry *backoff.Counter) (stop bool, _ error) {
	m := r.cfg.Metrics
	if took := leader.TookOver(); took != "" {
		r.log.Warn("leading: "+took, zap.String("relay", r.cfg.RelayName), zap.Int64("epoch", leader.Epoch()))
	} else {
		r.log.Info("leading", zap.String("relay", r.cfg.RelayName), zap.Int64("epoch", leader.Epoch()))
	}
	// Once: the leader's liveness is leader_heartbeat in the progress row.
	row.beat(ctx, leadership.RoleLeader)
	r.state.setNotReady("leading, not yet delivering")
	m.SetLeader(true)
	started := time.Now()
	err := r.lead(ctx, leader)
	r.state.dropPublisher()
	m.SetLeader(false)
	m.SetMode("")
	r.state.setNotReady("leadership ended: restarting")
	if time.Since(started) > time.Minute {
		retry.Reset() // a long healthy term: start the backoff over
	}
	releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = leader.Release(releaseCtx)
	cancel()
	if ctx.Err() != nil {
		if err != nil && !errors.Is(err, context.Canceled) {
			r.log.Warn("shutdown finished with an error", zap.Error(err))
		}
		return true, nil
	}
	if isFatal(err) {
		r.markFailed(ctx, leader.Epoch(), err)
		return true, err
	}
	d := retry.Next()
	r.log.Warn("relay pipeline stopped, restarting from the checkpoint", zap.Error(err), zap.Duration("in", d))
	recCtx, cancelRec := context.WithTimeout(ctx, 5*time.Second)
	_ = r.store.RecordError(recCtx, leader.Epoch(), err.Error())
	cancelRec()
	return !backoff.Sleep(ctx, d), nil
}

// preflight checks the server once, before leadership: a server that refuses
// the relay's user or database, lacks the relay's tables, or (in binlog mode)
// cannot serve the binlog is reported at once with the fix.
func (r *Relay) preflight(ctx context.Context) error {
	if err := r.ping(ctx); err != nil {
		return err
	}
	if r.cfg.Mode == ModeAuto {
		// The binlog connection (go-mysql's client) with the same TLS
		// settings: a TLS failure is a setup error in every mode, not a
		// reason to poll. Other failures are the auto mode's to handle.
		var te *canal.TLSError
		if err := canal.CheckConnection(ctx, r.canal); errors.As(err, &te) {
			return &ConfigError{err}
		}
	}
	if r.cfg.Mode == ModeBinlog { // auto falls back to polling; poll needs no binlog
		if err := r.binlog.Preflight(ctx); err != nil {
			return &ConfigError{err}
		}
	}
	return r.checkTables(ctx)
}

// ping reaches the server. A refusal (wrong password, unknown database,
// nothing listening) is reported at once: retrying does not change the
// answer, and a supervisor restarts the process anyway. Only an attempt that
// times out or breaks mid-handshake is retried (5 attempts, 1 s apart): a
// server that is starting or a network blip can clear within seconds.
func (r *Relay) ping(ctx context.Context) error {
	where := fmt.Sprintf("MySQL at %s as user %q, database %q", net.JoinHostPort(r.canal.Host, strconv.Itoa(r.canal.Port)), r.canal.User, r.canal.Schema)
	for attempt := 0; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := r.db.PingContext(pctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return nil
		}
		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = canal.ExplainConnectError(ectx, r.canal, err)
		cancel()
		var me *mysql.MySQLError
		var te *canal.TLSError
		switch {
		case errors.As(err, &te):
			return &ConfigError{fmt.Errorf("connect to %s: %w", where, err)}
		case errors.As(err, &me) && (me.Number == 1045 || me.Number == 1044): // ER_ACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR
			hint := ""
			if r.canal.TLS != nil && len(r.canal.TLS.Certificates) == 0 {
				hint = "; a user created REQUIRE X509 needs Config.MySQLTLSCert and Config.MySQLTLSKey"
			}
			return &ConfigError{fmt.Errorf("connect to %s: access denied (%s); check the password in Config.MySQLDSN or Config.MySQLPasswordFile, that the user may connect from this host, and its grants on the database%s", where, me.Message, hint)}
		case errors.As(err, &me) && me.Number == 1049: // ER_BAD_DB_ERROR
			return &ConfigError{fmt.Errorf("connect to %s: database %q does not exist; create it (CREATE DATABASE `%s` CHARACTER SET utf8mb4) and run `outbox-relay migrate`, or fix Config.MySQLDSN", where, r.canal.Schema, r.canal.Schema)}
		case errors.Is(err, syscall.ECONNREFUSED):
			return fmt.Errorf("connect to %s: connection refused; check the host and port in Config.MySQLDSN and that the server is running", where)
		case attempt == 4:
			return fmt.Errorf("connect to %s: %w", where, err)
		}
		if !backoff.Sleep(ctx, time.Second) {
			return nil
		}
	}
}

// ping1 pings the database once.
func (r *Relay) ping1(ctx context.Context) error { return r.db.PingContext(ctx) }

// checkTables makes sure the tables migrate creates exist with every column
// this version uses, and that the relay's user may do what the relay does
// with them (checkGrants): without them the relay could only retry
// leadership forever, or fail at its first write of a new column or of a
// kind it has no privilege for.
func (r *Relay) checkTables(ctx context.Context) error {
	quoted, err := outbox.QuoteTable(r.cfg.Table)
	if err != nil {
		return &ConfigError{fmt.Errorf("table: %w", err)}
	}
	for _, t := range []struct{ name, quoted string }{
		{migrations.ProgressTable, "`" + migrations.ProgressTable + "`"},
		{r.cfg.Table, quoted},
		{migrations.FailedTable, "`" + migrations.FailedTable + "`"},
		{migrations.InstancesTable, "`" + migrations.InstancesTable + "`"},
	} {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rows, err := r.db.QueryContext(qctx, "SELECT 1 FROM "+t.quoted+" LIMIT 0")
		if err == nil {
			err = rows.Close()
		}
		cancel()
		var me *mysql.MySQLError
		switch {
		case errors.As(err, &me) && me.Number == 1146: // ER_NO_SUCH_TABLE
			return &ConfigError{fmt.Errorf("table %q does not exist in database %q; run `outbox-relay migrate` with the same Config.MySQLDSN and Config.Table first", t.name, r.canal.Schema)}
		case errors.As(err, &me) && (me.Number == 1142 || me.Number == 1044):
			// No SELECT: checkGrants names it with the others missing.
		case err != nil && ctx.Err() == nil:
			return fmt.Errorf("check table %q: %w", t.name, err)
		}
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.checkGrants(qctx, quoted); err != nil {
		return err
	}
	// Tables of an older version lack the columns later migrations add.
	err = migrations.Current(qctx, r.db, r.cfg.Table)
	var schemaErr *migrations.SchemaError
	switch {
	case migrations.ColumnGone(err):
		// Renamed away or dropped, perhaps for a moment (a migration
		// tool, a reverted ALTER): poll mode waits for it (waitShape);
		// binlog mode reads the binlog up to the first event without
		// it, and stops there naming it.
		r.log.Warn("the outbox table lacks a column the relay reads; starting anyway", zap.Error(err))
	case errors.As(err, &schemaErr):
		return &ConfigError{fmt.Errorf("database %q: %w", r.canal.Schema, err)}
	case err != nil && ctx.Err() == nil:
		return fmt.Errorf("check the relay's tables: %w", err)
	}
	return nil
}

// markFailed records a fatal error as status FAILED in the progress row
// (checkpoint.Store.MarkFailed), so `status` shows why no relay delivers:
// by the leader of epoch, or, with epoch 0, by a process that never led
// while no other holds the leadership. Best effort: a row that cannot be
// written (tables missing, database refusing) changes nothing.
func (r *Relay) markFailed(ctx context.Context, epoch int64, err error) {
	if !isFatal(err) {
		return
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if merr := r.store.MarkFailed(mctx, epoch, err.Error()); merr != nil {
		r.log.Debug("status FAILED not recorded", zap.Error(merr))
	}
}

// clearFailed ends a FAILED status once a term delivers again.
func (r *Relay) clearFailed(ctx context.Context, epoch int64) {
	if err := r.progress.ClearFailed(ctx, epoch); err != nil && ctx.Err() == nil {
		r.log.Warn("status FAILED not cleared", zap.Error(err))
	}
}

func isFatal(err error) bool {
	var cfgErr *ConfigError
	var schemaErr *canal.SchemaError
	var purged *canal.PurgedError
	var lost *LostGTIDsError
	return errors.As(err, &cfgErr) || errors.As(err, &schemaErr) || errors.As(err, &purged) || errors.As(err, &lost)
}
