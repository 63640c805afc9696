package relay

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/mysqlconn"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Config is the relay's configuration; zero values take the defaults below.
type Config struct {
	MySQLDSN        string // go-sql-driver form user:pass@tcp(host:port)/db
	AMQPURL         string
	AMQPOptions     publish.ConnOptions // TLS files and password file for AMQPURL, read at every dial
	Table           string              // default "outbox"
	RelayName       string              // default "default"
	ServerID        uint32              // our replica server id; default 7_364_000 + a value derived from the relay name
	DefaultExchange string              // exchange for rows whose exchange is ''
	OnDelivered     string              // checkpoint.Delete (default) or checkpoint.Mark

	// MySQLTLSCA, MySQLTLSCert and MySQLTLSKey are PEM files: the CA that
	// must have signed the server's certificate (its host name is checked
	// too), and a client certificate with its key (REQUIRE X509 users).
	// Either turns TLS on when MySQLDSN has no tls parameter; the DSN's tls
	// parameter and these hold for every connection, the binlog's too.
	MySQLTLSCA, MySQLTLSCert, MySQLTLSKey string
	// MySQLPasswordFile holds the MySQL password (trailing line breaks
	// removed), read again before every new connection, binlog included: a
	// rotated password needs no restart. MySQLDSN must then have none.
	MySQLPasswordFile string

	Mode                string        // ModeAuto (default), ModeBinlog or ModePoll
	FallbackAfter       time.Duration // auto: binlog trouble this long (database answering) → poll; default 30s
	BinlogRetryInterval time.Duration // auto, polling: how often the binlog is probed again; default 30s
	PollInterval        time.Duration // poll: an idle worker's wait between rounds; default 100ms
	PollBatch           int           // poll: rows a worker claims per transaction; default 500
	PollWorkers         int           // poll: workers; default poller.DefaultWorkers (2)

	MaxInflightBytes int64 // default 64 MiB
	Lanes            int   // publishing lanes (AMQP channels); default 2
	ConfirmWindow    int   // unconfirmed messages per lane; default 256
	MaxAttempts      int   // broker nacks before a message goes to outbox_failed; default 5

	HeartbeatInterval  time.Duration // leadership heartbeat; default 2s
	LeaderLease        time.Duration // a leader without a heartbeat this long is taken over by a standby; default 10s (or 5 heartbeats if longer), at least 3 heartbeats
	CheckpointInterval time.Duration // how often an idle relay moves its position past foreign transactions; default 30s
	StandbyRetry       time.Duration // how often a standby tries to take leadership; default 5s
	ShutdownTimeout    time.Duration // how long a stop (shutdown, pause) waits for the work under way; default 30s

	Instance string // leader_instance; default host:pid
	Logger   *zap.Logger
	// Metrics receives the relay's figures; nil records nothing.
	Metrics *metrics.Metrics
	// Tracer, when set, makes one publish span per message (see
	// publish.Config.Tracer); nil (the default) makes none.
	Tracer trace.Tracer
	// OnMode, if set, is told each mode a leader term enters (binlog or
	// poll) and why, from the relay's goroutine; it must not block.
	OnMode func(mode, reason string)
	// Maintenance, if set, is called at the start of each leader term and
	// then every MaintenanceInterval (default 1h) while this instance leads,
	// never on a standby; calls do not overlap. Its context ends with the
	// term (shutdown or leadership lost); it must return soon after.
	Maintenance         func(ctx context.Context)
	MaintenanceInterval time.Duration
	// AcceptLostGTIDs lets a relay resume on a server that lacks
	// transactions it already published (a lossy failover, docs/operations.md):
	// it delivers what is pending and tails from the server's own position,
	// logging at WARN what is skipped. Without it such a server is a
	// *LostGTIDsError.
	AcceptLostGTIDs bool
	// StateFile, if set, is a local file that keeps the newest position this
	// process acknowledged across restarts (see stateFile): the lossy-failover
	// check of a process started fresh compares the server with it instead of
	// only with the replicated progress row. Its directory must exist and be
	// writable; one file per relay name.
	StateFile string
}

// ConfigError is a configuration or server-setup problem that retrying will
// not fix; the CLI exits 2 on it.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// Validate fills defaults and checks values; errors are *ConfigError.
func (c *Config) Validate() error {
	bad := func(format string, a ...any) error { return &ConfigError{fmt.Errorf(format, a...)} }
	if c.MySQLDSN == "" {
		return bad("mysql-dsn is empty: set --mysql-dsn user:pass@tcp(host:3306)/db")
	}
	target, err := mysqlconn.New(c.mysqlOptions())
	if err != nil {
		return bad("%w", err)
	}
	if target.DBName() == "" {
		return bad("mysql-dsn names no database: add it after the slash, e.g. user:pass@tcp(host:3306)/app")
	}
	if c.AMQPURL == "" {
		return bad("amqp-url is empty: set --amqp-url amqp://user:pass@host:5672/")
	}
	if err := c.AMQPOptions.Check(c.AMQPURL); err != nil {
		return bad("%w", err)
	}
	if c.Table == "" {
		c.Table = "outbox"
	}
	if c.RelayName == "" {
		c.RelayName = "default"
	}
	if c.ServerID == 0 {
		c.ServerID = defaultServerID(c.RelayName)
	}
	switch c.OnDelivered {
	case "":
		c.OnDelivered = checkpoint.Delete
	case checkpoint.Delete, checkpoint.Mark:
	default:
		return bad("on-delivered %q: want %q or %q", c.OnDelivered, checkpoint.Delete, checkpoint.Mark)
	}
	switch c.Mode {
	case "":
		c.Mode = ModeAuto
	case ModeAuto, ModeBinlog, ModePoll:
	default:
		return bad("mode %q: want %s, %s or %s", c.Mode, ModeAuto, ModeBinlog, ModePoll)
	}
	setDefault(&c.FallbackAfter, 30*time.Second)
	setDefault(&c.BinlogRetryInterval, 30*time.Second)
	setDefault(&c.MaxInflightBytes, 64<<20)
	// Few channels: each AMQP channel is a process in the broker, which
	// pays for every extra one per message (docs/benchmarks.md has the
	// figures). Raise it when the broker is far: a lane carries at most
	// --confirm-window messages per round trip.
	setDefault(&c.Lanes, 2)
	setDefault(&c.ConfirmWindow, 256)
	setDefault(&c.MaxAttempts, 5)
	setDefault(&c.HeartbeatInterval, 2*time.Second)
	setDefault(&c.CheckpointInterval, 30*time.Second)
	setDefault(&c.LeaderLease, max(10*time.Second, 5*c.HeartbeatInterval))
	if c.LeaderLease < 3*c.HeartbeatInterval {
		return bad("leader-lease %v: at least 3 heartbeat intervals (%v), or a leader loses it between two heartbeats", c.LeaderLease, 3*c.HeartbeatInterval)
	}
	// A standby looks often enough to take over soon after the lease ends.
	setDefault(&c.StandbyRetry, min(5*time.Second, c.LeaderLease/4))
	setDefault(&c.ShutdownTimeout, 30*time.Second)
	if c.MaxInflightBytes < 1<<20 {
		return bad("max-inflight-bytes %d is below 1 MiB", c.MaxInflightBytes)
	}
	if c.Lanes > 1024 {
		return bad("lanes %d: at most 1024 (each is an AMQP channel)", c.Lanes)
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}

// mysqlOptions are the MySQL connection settings of c.
func (c *Config) mysqlOptions() mysqlconn.Options {
	return mysqlconn.Options{DSN: c.MySQLDSN, TLSCA: c.MySQLTLSCA, TLSCert: c.MySQLTLSCert, TLSKey: c.MySQLTLSKey,
		PasswordFile: c.MySQLPasswordFile}
}

func setDefault[T int | int64 | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// defaultServerID derives a stable replica server id from the relay name so
// two relays with different names on one server do not clash by default.
func defaultServerID(name string) uint32 {
	var h uint32 = 2166136261
	for i := 0; i < len(name); i++ {
		h = (h ^ uint32(name[i])) * 16777619
	}
	return 7_364_000 + h%100_000
}
