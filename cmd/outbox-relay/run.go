package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
)

func init() {
	register(&command{
		name:    "run",
		summary: "relay outbox rows to RabbitMQ by tailing the binlog",
		help: `Takes leadership of --relay-name (other instances wait as standbys), checks the
server (binlog on, ROW format, FULL row image and metadata, replication grants,
unique --server-id), delivers the rows already pending, then tails the binlog
and publishes every committed outbox row with publisher confirms, in commit
order per partition key. The acknowledged position is stored in
outbox_relay_progress in the same database. SIGTERM or Ctrl-C: stop reading
at a transaction boundary (or once the poll rounds under way have committed),
wait for in-flight confirms, acknowledge, exit 0; --shutdown-timeout bounds
it, and what it cuts is logged with the messages that will be published again.
With --mode auto (the default) a server that cannot serve the binlog (binlog
off, grants missing, checkpoint purged) is polled with FOR UPDATE SKIP LOCKED
instead, and the binlog is probed again every --binlog-retry-interval; the
handover back delivers every pending row exactly once. With --mode binlog such a
server exits with code 2 and a message naming the fix. In every mode a MySQL
user lacking a privilege run needs on its tables exits with code 2, naming each
privilege, table and the GRANT that adds it (docs/operations.md, "Grants per
role", lists every command's).`,
		setup: setupRun,
	})
}

func setupRun(fs *flag.FlagSet) runFunc {
	var cfg relay.Config
	maxInflight := byteSize(relay.DefaultMaxInflightBytes)
	maxMessage := byteSize(relay.DefaultAMQPMaxMessageSize)
	var serverID uint
	my := declareMySQL(fs, defaultDSN, "MySQL/MariaDB `dsn` user:pass@tcp(host:port)/dbname; the user's grants: docs/operations.md, Grants per role")
	declareAMQP(fs, &cfg.AMQPURL, &cfg.AMQPOptions, "RabbitMQ `url` amqp://user:pass@host:5672/vhost, or amqps://…:5671/ for TLS; several URLs separated by commas for the nodes of a cluster: the relay connects to the first that answers and, when that connection is lost, dials the next")
	declareTable(fs, &cfg.Table)
	declareRelayName(fs, &cfg.RelayName, relay.DefaultRelayName, "relay `name`: one leader per name, one progress row per name")
	fs.UintVar(&serverID, "server-id", 0, "replica server `id` the relay reads the binlog as; unique among the server's replicas (0 = derived from --relay-name)")
	fs.StringVar(&cfg.DefaultExchange, "default-exchange", "", "`exchange` for rows whose exchange column is empty; it, and every exchange a row names, must exist with a queue bound (the relay declares none; a message to a missing exchange goes to outbox_failed)")
	fs.StringVar(&cfg.OnDelivered, "on-delivered", relay.DefaultOnDelivered, "what happens to a delivered row: delete or mark (sets delivered_at)")
	fs.StringVar((*string)(&cfg.Mode), "mode", string(relay.DefaultMode), "auto (binlog when the server serves it, else poll), binlog, or poll")
	fs.DurationVar(&cfg.FallbackAfter, "fallback-after", relay.DefaultFallbackAfter, "auto: binlog trouble lasting this long while the database answers switches to poll mode")
	fs.DurationVar(&cfg.BinlogRetryInterval, "binlog-retry-interval", relay.DefaultBinlogRetryInterval, "auto: while polling, how often the binlog is probed again")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", relay.DefaultPollInterval, "poll: how long an idle worker waits before polling again")
	fs.IntVar(&cfg.PollBatch, "poll-batch", relay.DefaultPollBatch, "poll: rows one worker claims per transaction")
	fs.IntVar(&cfg.PollWorkers, "poll-workers", relay.DefaultPollWorkers, "poll: workers, each with its own AMQP channel and database transaction")
	fs.Var(&maxInflight, "max-inflight-bytes", "`bytes` of messages read but not yet acknowledged, parked ones included (e.g. 16MiB); when full, reading stops")
	fs.IntVar(&cfg.Lanes, "lanes", relay.DefaultLanes, "publishing lanes (AMQP channels); rows of one partition key share a lane (raise for a far broker: a lane carries at most --confirm-window messages per round trip)")
	fs.IntVar(&cfg.ConfirmWindow, "confirm-window", relay.DefaultConfirmWindow, "messages on the wire (sent, unconfirmed) per lane; messages parked behind their key count in --max-inflight-bytes only")
	fs.Var(&maxMessage, "amqp-max-message-size", "the broker's max_message_size in `bytes` (e.g. 128MiB, RabbitMQ's default); a row whose payload is larger goes to outbox_failed unsent. Set it when the broker's was changed")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", relay.DefaultMaxAttempts, "broker nacks, or connections the broker closed over the message's frames, before a message goes to outbox_failed (over 30s at least)")
	fs.DurationVar(&cfg.CheckpointInterval, "checkpoint-interval", relay.DefaultCheckpointInterval, "how often an idle relay moves its stored position past other tables' transactions")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", relay.DefaultHeartbeatInterval, "leadership heartbeat")
	fs.DurationVar(&cfg.LeaderLease, "leader-lease", relay.DefaultLeaderLease, "a leader whose heartbeat is older than this is taken over by a standby, and a new leader whose predecessor did not stop cleanly publishes only once its heartbeat is this old; at least 3 heartbeat intervals; unset, 5 heartbeat intervals when that is longer than the default")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", relay.DefaultShutdownTimeout, "how long a stop (SIGTERM, pause) waits for the work under way (the transaction being read, poll rounds, in-flight confirms) before cutting it; a cut is logged with the messages that will be published again")
	declareOverride(fs, &cfg.AcceptLostGTIDs, "accept-lost-gtids", "resume on a server that lacks GTIDs this relay already published (a lossy failover): deliver what is pending there and tail from its own position")
	fs.StringVar(&cfg.StateFile, "state-file", "", "`path` of a local file keeping the newest position this process published, so that a restarted process still detects a lossy failover (empty: memory only; one file per relay name)")
	tracing := fs.Bool("tracing", false, "export one OpenTelemetry span per published message over OTLP/HTTP, in the producer's trace; configured by the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER, ...; docs/operations.md, Tracing)")
	metricsAddr := fs.String("metrics-addr", ":9464", "`address` for /metrics, /healthz and /readyz; empty turns HTTP off")
	maint := declareMaintenance(fs)
	fs.StringVar(&cfg.Stream.Stream, "stream", "", "publish into the RabbitMQ super stream `NAME` (partition streams NAME-0 … NAME-(N-1), over the stream protocol) instead of exchanges: exactly once in binlog mode while it resumes from its own checkpoint, at least once otherwise (docs/operations.md, The stream destination)")
	fs.IntVar(&cfg.Stream.Partitions, "stream-partitions", 1, "--stream: the number `N` of partition streams; a row goes to murmur3(partition key, seed 104729) mod N, as the super-stream clients route")
	fs.StringVar(&cfg.Stream.URL, "stream-url", "", "--stream: the stream protocol's `url` rabbitmq-stream://user:pass@host:5552/vhost, or a cluster's nodes separated by commas (empty: each --amqp-url's user, password, host and vhost on port 5552)")
	declare := fs.Bool("stream-declare", true, "--stream: declare the partition streams that do not exist at start (existing ones are used as they are); false when an operator declares them")
	f := &runFlags{fs: fs, cfg: &cfg, maxInflight: &maxInflight, maxMessage: &maxMessage, serverID: &serverID, my: my, tracing: tracing,
		metricsAddr: metricsAddr, maint: maint, streamDeclare: declare}
	return f.run
}

// runFlags are run's flags once declared: the relay's Config and what run
// adds around the relay (metrics, tracing, maintenance).
type runFlags struct {
	fs          *flag.FlagSet
	cfg         *relay.Config
	maxInflight *byteSize
	maxMessage  *byteSize
	serverID    *uint
	my          *mysqlFlags
	tracing     *bool
	metricsAddr *string
	maint       *maintenanceFlags
	// streamDeclare is --stream-declare.
	streamDeclare *bool
}

// run runs the relay until ctx ends, with its HTTP endpoints, tracing and
// maintenance when the flags ask for them.
func (f *runFlags) run(ctx context.Context, inv *invocation) error {
	cfg, err := f.config(inv)
	if err != nil {
		return err
	}
	// go-sql-driver logs dropped connections on its own to stderr; keep
	// its lines in our log, at debug: the relay reports what matters.
	_ = mysql.SetLogger(driverLog{inv.log.Named("mysql-driver")})
	closeMaintenance, err := f.maint.install(&cfg, f.my, inv.log)
	if err != nil {
		return err
	}
	defer closeMaintenance()
	reg, ln, err := f.listen(&cfg)
	if err != nil {
		return err
	}
	closeListener := func() {
		if ln != nil {
			ln.Close()
		}
	}
	if *f.tracing {
		tracer, stopTracing, err := startTracing(ctx, inv.log)
		if err != nil {
			closeListener()
			return err
		}
		defer stopTracing()
		cfg.Tracer = tracer
	}
	if err := declareStreams(cfg.Stream, *f.streamDeclare, inv.log); err != nil {
		closeListener()
		return err
	}
	r, err := relay.New(cfg)
	if err != nil {
		closeListener()
		return asUsage(err)
	}
	defer r.Close()
	// HTTP outlives the relay's shutdown so /metrics can be scraped while
	// in-flight confirms finish.
	defer serveHTTP(ctx, ln, reg, r, inv)()
	inv.log.Info("starting", zap.String("relay", cfg.RelayName), zap.String("table", cfg.Table),
		zap.String("mysql", redact.DSN(cfg.MySQLDSN)), zap.String("amqp", redact.URL(cfg.AMQPURL)))
	if err := r.Run(ctx); err != nil {
		return asUsage(err)
	}
	inv.log.Info("stopped")
	return nil
}

// config checks the flags and returns the relay's Config they make.
func (f *runFlags) config(inv *invocation) (relay.Config, error) {
	if err := noArgs(inv, "run"); err != nil {
		return relay.Config{}, err
	}
	if *f.serverID > 1<<32-1 {
		return relay.Config{}, usagef("--server-id %d: at most %d", *f.serverID, uint32(1<<32-1))
	}
	cfg := *f.cfg
	if err := checkAMQP(cfg.AMQPURL, cfg.AMQPOptions); err != nil {
		return relay.Config{}, err
	}
	cfg.ServerID = uint32(*f.serverID)
	cfg.MySQLDSN, cfg.MySQLPasswordFile = f.my.dsn, f.my.passwordFile
	cfg.MySQLTLSCA, cfg.MySQLTLSCert, cfg.MySQLTLSKey = f.my.tlsCA, f.my.tlsCert, f.my.tlsKey
	cfg.MaxInflightBytes = int64(*f.maxInflight)
	cfg.AMQPMaxMessageSize = int64(*f.maxMessage)
	if !isSet(f.fs, "leader-lease") {
		cfg.LeaderLease = 0 // the library's default follows the heartbeat
	}
	cfg.Logger = inv.log
	if err := streamConfig(&cfg); err != nil {
		return relay.Config{}, err
	}
	return cfg, nil
}

// listen makes the metrics registry and binds --metrics-addr, before
// anything else so that a taken port is reported at once; with the flag
// empty there is neither.
func (f *runFlags) listen(cfg *relay.Config) (*prometheus.Registry, net.Listener, error) {
	if *f.metricsAddr == "" {
		return nil, nil, nil
	}
	reg, m, err := metrics.NewRegistry()
	if err != nil {
		return nil, nil, fmt.Errorf("set up metrics: %w", err)
	}
	ln, err := metrics.Listen(*f.metricsAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	cfg.Metrics = m
	return reg, ln, nil
}

// serveHTTP serves /metrics, /healthz and /readyz of r on ln (nil: none)
// until stop is called; stop waits for the server to end.
func serveHTTP(ctx context.Context, ln net.Listener, reg *prometheus.Registry, r *relay.Relay, inv *invocation) (stop func()) {
	if ln == nil {
		return func() {}
	}
	// /readyz quotes errors of the broker and the database client.
	ready := func() error {
		if err := r.Ready(); err != nil {
			return errors.New(flagNames(redact.Scrub(err.Error(), *inv.secrets)))
		}
		if node := r.BrokerNode(); node != "" {
			return metrics.ReadyNote("publishing to RabbitMQ node " + node)
		}
		return nil
	}
	done := make(chan error, 1)
	httpCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() { done <- metrics.ServeListener(httpCtx, ln, reg, ready, inv.log.Named("http")) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			inv.log.Warn("metrics endpoint", zap.Error(err))
		}
	}
}

// checkAMQPURL refuses, as bad usage, an --amqp-url the AMQP client cannot
// dial: one URL or several separated by commas, none empty, each amqp:// or
// amqps:// (publish.SplitURLs; no password in the message).
func checkAMQPURL(raw string) error {
	if _, err := publish.SplitURLs(raw); err != nil {
		return usagef("%v", err)
	}
	return nil
}

type driverLog struct{ log *zap.Logger }

func (d driverLog) Print(v ...any) { d.log.Debug(strings.TrimSpace(fmt.Sprint(v...))) }

// asUsage turns the relay's configuration errors into exit code 2.
func asUsage(err error) error {
	var ce *relay.ConfigError
	var lost *relay.LostGTIDsError
	if errors.As(err, &ce) || errors.As(err, &lost) {
		return &usageError{err}
	}
	return err
}

// byteSize is a flag value in bytes with an optional binary unit:
// 1048576, 512KiB, 64MiB, 1GiB (KB/MB/GB are read as the same powers of 1024).
type byteSize int64

// String gives the size in the largest binary unit that divides it
// (64MiB, not 67108864), the form the docs use; Set reads it back.
func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b *byteSize) Set(s string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}}
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return fmt.Errorf("%q is not a size: use bytes or a number with KiB, MiB or GiB", s)
	}
	*b = byteSize(n * mult)
	return nil
}
