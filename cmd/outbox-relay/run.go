package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/outbox"
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
	maxInflight := byteSize(64 << 20)
	var serverID uint
	my := declareMySQL(fs, defaultDSN, "MySQL/MariaDB `dsn` user:pass@tcp(host:port)/dbname; the user's grants: docs/operations.md, Grants per role")
	declareAMQP(fs, &cfg.AMQPURL, &cfg.AMQPOptions)
	fs.StringVar(&cfg.Table, "table", outbox.DefaultTable, "outbox table `name`")
	fs.StringVar(&cfg.RelayName, "relay-name", "default", "relay `name`: one leader per name, one progress row per name")
	fs.UintVar(&serverID, "server-id", 0, "replica server `id` the relay reads the binlog as; unique among the server's replicas (0 = derived from --relay-name)")
	fs.StringVar(&cfg.DefaultExchange, "default-exchange", "", "`exchange` for rows whose exchange column is empty; it, and every exchange a row names, must exist with a queue bound (the relay declares none; a message to a missing exchange goes to outbox_failed)")
	fs.StringVar(&cfg.OnDelivered, "on-delivered", "delete", "what happens to a delivered row: delete or mark (sets delivered_at)")
	fs.StringVar(&cfg.Mode, "mode", "auto", "auto (binlog when the server serves it, else poll), binlog, or poll")
	fs.DurationVar(&cfg.FallbackAfter, "fallback-after", 30*time.Second, "auto: binlog trouble lasting this long while the database answers switches to poll mode")
	fs.DurationVar(&cfg.BinlogRetryInterval, "binlog-retry-interval", 30*time.Second, "auto: while polling, how often the binlog is probed again")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", 100*time.Millisecond, "poll: how long an idle worker waits before polling again")
	fs.IntVar(&cfg.PollBatch, "poll-batch", 500, "poll: rows one worker claims per transaction")
	fs.IntVar(&cfg.PollWorkers, "poll-workers", 2, "poll: workers, each with its own AMQP channel and database transaction")
	fs.Var(&maxInflight, "max-inflight-bytes", "`bytes` of messages read but not yet acknowledged (e.g. 64MiB); when full, reading stops")
	fs.IntVar(&cfg.Lanes, "lanes", 2, "publishing lanes (AMQP channels); rows of one partition key share a lane (raise for a far broker: a lane carries at most --confirm-window messages per round trip)")
	fs.IntVar(&cfg.ConfirmWindow, "confirm-window", 256, "unconfirmed messages per lane")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", 5, "broker nacks before a message goes to outbox_failed")
	fs.DurationVar(&cfg.CheckpointInterval, "checkpoint-interval", 30*time.Second, "how often an idle relay moves its stored position past other tables' transactions")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", 2*time.Second, "leadership heartbeat")
	fs.DurationVar(&cfg.LeaderLease, "leader-lease", 10*time.Second, "a leader whose heartbeat is older than this is taken over by a standby, and a new leader whose predecessor did not stop cleanly publishes only once its heartbeat is this old; at least 3 heartbeat intervals")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "how long a stop (SIGTERM, pause) waits for the work under way (the transaction being read, poll rounds, in-flight confirms) before cutting it; a cut is logged with the messages that will be published again")
	declareOverride(fs, &cfg.AcceptLostGTIDs, "accept-lost-gtids", "resume on a server that lacks GTIDs this relay already published (a lossy failover): deliver what is pending there and tail from its own position")
	fs.StringVar(&cfg.StateFile, "state-file", "", "`path` of a local file keeping the newest position this process published, so that a restarted process still detects a lossy failover (empty: memory only; one file per relay name)")
	tracing := fs.Bool("tracing", false, "export one OpenTelemetry span per published message over OTLP/HTTP, in the producer's trace; configured by the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER, ...; docs/operations.md, Tracing)")
	metricsAddr := fs.String("metrics-addr", ":9464", "`address` for /metrics, /healthz and /readyz; empty turns HTTP off")
	maint := declareMaintenance(fs)
	return func(ctx context.Context, inv *invocation) error {
		if err := noArgs(inv, "run"); err != nil {
			return err
		}
		if serverID > 1<<32-1 {
			return usagef("--server-id %d: at most %d", serverID, uint32(1<<32-1))
		}
		if err := checkAMQP(cfg.AMQPURL, cfg.AMQPOptions); err != nil {
			return err
		}
		cfg.ServerID = uint32(serverID)
		cfg.MySQLDSN, cfg.MySQLPasswordFile = my.dsn, my.passwordFile
		cfg.MySQLTLSCA, cfg.MySQLTLSCert, cfg.MySQLTLSKey = my.tlsCA, my.tlsCert, my.tlsKey
		cfg.MaxInflightBytes = int64(maxInflight)
		cfg.Logger = inv.log
		// go-sql-driver logs dropped connections on its own to stderr; keep
		// its lines in our log, at debug: the relay reports what matters.
		_ = mysql.SetLogger(driverLog{inv.log.Named("mysql-driver")})
		closeMaintenance, err := maint.install(&cfg, my, inv.log)
		if err != nil {
			return err
		}
		defer closeMaintenance()
		var (
			reg *prometheus.Registry
			ln  net.Listener
		)
		if *metricsAddr != "" {
			var err error
			if reg, cfg.Metrics, err = metrics.NewRegistry(); err != nil {
				return fmt.Errorf("set up metrics: %w", err)
			}
			// Bind before anything else: a taken port is reported at once.
			if ln, err = metrics.Listen(*metricsAddr); err != nil {
				return err
			}
		}
		if *tracing {
			tracer, stopTracing, err := startTracing(ctx, inv.log)
			if err != nil {
				if ln != nil {
					ln.Close()
				}
				return err
			}
			defer stopTracing()
			cfg.Tracer = tracer
		}
		r, err := relay.New(cfg)
		if err != nil {
			if ln != nil {
				ln.Close()
			}
			return asUsage(err)
		}
		defer r.Close()
		httpDone := make(chan error, 1)
		httpCtx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
		if ln != nil {
			// /readyz quotes errors of the broker and the database client.
			ready := func() error {
				if err := r.Ready(); err != nil {
					return errors.New(redact.Scrub(err.Error(), *inv.secrets))
				}
				return nil
			}
			go func() { httpDone <- metrics.ServeListener(httpCtx, ln, reg, ready, inv.log.Named("http")) }()
		} else {
			httpDone <- nil
		}
		// HTTP outlives the relay's shutdown so /metrics can be scraped
		// while in-flight confirms finish.
		defer func() {
			stopHTTP()
			if err := <-httpDone; err != nil {
				inv.log.Warn("metrics endpoint", zap.Error(err))
			}
		}()
		inv.log.Info("starting", zap.String("relay", cfg.RelayName), zap.String("table", cfg.Table),
			zap.String("mysql", redact.DSN(cfg.MySQLDSN)), zap.String("amqp", redact.URL(cfg.AMQPURL)))
		if err := r.Run(ctx); err != nil {
			return asUsage(err)
		}
		inv.log.Info("stopped")
		return nil
	}
}

// checkAMQPURL refuses, as bad usage, a URL the AMQP client cannot dial:
// another scheme (http://, the management port's), or one that does not
// parse. The message shows the wanted form and never the password, nor a
// piece of it that the parser cut out.
func checkAMQPURL(raw string) error {
	if _, err := amqp.ParseURI(raw); err != nil {
		return usagef("--amqp-url %q: %v; the form is amqp://user:pass@host:5672/vhost (amqps:// for TLS)", redact.URL(raw), redact.ParseError(err, raw))
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
