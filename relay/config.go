package relay

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/internal/mysqlconn"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/poller"
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// Defaults of Config: zero values take them (SetDefaults), and the CLI's
// flags declare them as their defaults.
const (
	DefaultTable               = outbox.DefaultTable
	DefaultRelayName           = checkpoint.DefaultRelayName
	DefaultOnDelivered         = checkpoint.DefaultOnDelivered
	DefaultMode                = ModeAuto
	DefaultFallbackAfter       = 30 * time.Second
	DefaultBinlogRetryInterval = 30 * time.Second
	DefaultPollInterval        = poller.DefaultInterval
	DefaultPollBatch           = poller.DefaultBatch
	DefaultPollWorkers         = poller.DefaultWorkers
	DefaultMaxInflightBytes    = 16 << 20
	// DefaultLanes: few channels, since each AMQP channel is a process in
	// the broker, which pays for every extra one per message
	// (docs/benchmarks.md has the figures). Raise it when the broker is far:
	// a lane carries at most ConfirmWindow messages per round trip.
	DefaultLanes               = 2
	DefaultConfirmWindow       = publish.DefaultConfirmWindow
	DefaultMaxAttempts         = publish.DefaultMaxAttempts
	DefaultAMQPMaxMessageSize  = publish.DefaultMaxMessageSize
	DefaultHeartbeatInterval   = leadership.DefaultHeartbeatInterval
	DefaultLeaderLease         = leadership.DefaultLeaderLease // with the default heartbeat; see leadership.LeaderLeaseFor
	DefaultCheckpointInterval  = 5 * time.Minute
	DefaultShutdownTimeout     = 30 * time.Second
	DefaultMaintenanceInterval = time.Hour
)

// Config is the relay's configuration; zero values take the defaults above
// (SetDefaults). Errors about it name its fields (Config.LeaderLease).
type Config struct {
	MySQLDSN    string              // go-sql-driver form user:pass@tcp(host:port)/db
	AMQPURL     string              // one URL, or several separated by commas (a cluster's nodes; publish.SplitURLs)
	AMQPOptions publish.ConnOptions // TLS files and password file for AMQPURL, read at every dial
	// Stream is the stream destination (--stream): when enabled, binlog
	// mode publishes into its partition streams instead of exchanges. Its
	// zero fields follow the rest of the Config (SetDefaults): producers
	// named RelayName, window ConfirmWindow, and the URL, password file
	// and TLS files of the AMQP broker.
	Stream          streams.Config
	Table           string // default DefaultTable
	RelayName       string // default DefaultRelayName
	ServerID        uint32 // our replica server id; default 7_364_000 + a value derived from the relay name
	DefaultExchange string // exchange for rows whose exchange is ''
	OnDelivered     string // checkpoint.Delete (default) or checkpoint.Mark

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

	Mode                Mode          // ModeAuto (default), ModeBinlog or ModePoll
	FallbackAfter       time.Duration // auto: binlog trouble this long (database answering) → poll; default 30s
	BinlogRetryInterval time.Duration // auto, polling: how often the binlog is probed again; default 30s
	PollInterval        time.Duration // poll: an idle worker's wait between rounds; default 100ms
	PollBatch           int           // poll: rows a worker claims per transaction; default 500
	PollWorkers         int           // poll: workers; default 2

	MaxInflightBytes int64 // default 16 MiB
	Lanes            int   // publishing lanes (AMQP channels); default 2
	ConfirmWindow    int   // messages on the wire per lane (parked ones count in MaxInflightBytes only); default 256
	MaxAttempts      int   // broker nacks, or connections the broker closed over the message's frames, before it goes to outbox_failed (over 30 s at least); default 5
	// AMQPMaxMessageSize is the broker's max_message_size: a row whose
	// payload is larger goes to outbox_failed unsent. Default 128 MiB,
	// RabbitMQ 3.10's default.
	AMQPMaxMessageSize int64

	HeartbeatInterval  time.Duration // leadership heartbeat; default 2s
	LeaderLease        time.Duration // a leader without a heartbeat this long is taken over by a standby; default leadership.LeaderLeaseFor(HeartbeatInterval): 10s, or 5 heartbeats if longer; at least 3 heartbeats
	CheckpointInterval time.Duration // how often an idle relay moves its position past foreign transactions (its own heartbeats among them); default 5m
	StandbyRetry       time.Duration // the longest a standby waits for the leader's lock in one look (a freed lock is taken at once); default 4/5 of the lease, at most 4/5 of it
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
	OnMode func(mode Mode, reason string)
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
	// process published across restarts (see stateFile): the lossy-failover
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

// SetDefaults fills the zero values of c with the defaults.
func (c *Config) SetDefaults() {
	setDefault(&c.Table, DefaultTable)
	setDefault(&c.RelayName, DefaultRelayName)
	if c.ServerID == 0 {
		c.ServerID = defaultServerID(c.RelayName)
	}
	setDefault(&c.OnDelivered, DefaultOnDelivered)
	setDefault(&c.Mode, DefaultMode)
	setDefault(&c.FallbackAfter, DefaultFallbackAfter)
	setDefault(&c.BinlogRetryInterval, DefaultBinlogRetryInterval)
	setDefault(&c.PollInterval, DefaultPollInterval)
	setDefault(&c.PollBatch, DefaultPollBatch)
	setDefault(&c.PollWorkers, DefaultPollWorkers)
	setDefault(&c.MaxInflightBytes, DefaultMaxInflightBytes)
	setDefault(&c.Lanes, DefaultLanes)
	setDefault(&c.ConfirmWindow, DefaultConfirmWindow)
	setDefault(&c.MaxAttempts, DefaultMaxAttempts)
	setDefault(&c.AMQPMaxMessageSize, DefaultAMQPMaxMessageSize)
	setDefault(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	setDefault(&c.CheckpointInterval, DefaultCheckpointInterval)
	setDefault(&c.LeaderLease, leadership.LeaderLeaseFor(c.HeartbeatInterval))
	// A standby waits for the lock, so a freed lock is taken at once, and
	// looks again just after a stopped leader's lease would end; between
	// looks it records itself in outbox_relay_instances, which must stay
	// inside the lease for status to show it alive.
	setDefault(&c.StandbyRetry, c.LeaderLease*4/5)
	setDefault(&c.ShutdownTimeout, DefaultShutdownTimeout)
	setDefault(&c.MaintenanceInterval, DefaultMaintenanceInterval)
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	c.setStreamDefaults()
}

// Validate checks c with its defaults filled (SetDefaults); it changes
// nothing. Errors are *ConfigError and name the Config fields.
func (c *Config) Validate() error {
	d := *c
	d.SetDefaults()
	bad := func(format string, a ...any) error { return &ConfigError{fmt.Errorf(format, a...)} }
	if d.MySQLDSN == "" {
		return bad("Config.MySQLDSN is empty: set it to user:pass@tcp(host:3306)/db")
	}
	target, err := mysqlconn.New(d.mysqlOptions())
	if err != nil {
		return bad("%w", err)
	}
	if target.DBName() == "" {
		return bad("Config.MySQLDSN names no database: add it after the slash, e.g. user:pass@tcp(host:3306)/app")
	}
	if d.AMQPURL == "" {
		return bad("Config.AMQPURL is empty: set it to amqp://user:pass@host:5672/")
	}
	if _, err := publish.SplitURLs(d.AMQPURL); err != nil {
		return bad("%w", err)
	}
	if err := d.AMQPOptions.Check(d.AMQPURL); err != nil {
		return bad("%w", err)
	}
	switch d.OnDelivered {
	case checkpoint.Delete, checkpoint.Mark:
	default:
		return bad("Config.OnDelivered %q: want %q or %q", d.OnDelivered, checkpoint.Delete, checkpoint.Mark)
	}
	switch d.Mode {
	case ModeAuto, ModeBinlog, ModePoll:
	default:
		return bad("Config.Mode %q: want %s, %s or %s", d.Mode, ModeAuto, ModeBinlog, ModePoll)
	}
	if d.LeaderLease < 3*d.HeartbeatInterval {
		return bad("Config.LeaderLease %v: at least 3 heartbeat intervals (%v), or a leader loses it between two heartbeats", d.LeaderLease, 3*d.HeartbeatInterval)
	}
	if d.MaxInflightBytes < 1<<20 {
		return bad("Config.MaxInflightBytes %d is below 1 MiB", d.MaxInflightBytes)
	}
	if err := d.Stream.Validate(); err != nil {
		return bad("%w", err)
	}
	if d.Lanes > 1024 {
		return bad("Config.Lanes %d: at most 1024 (each is an AMQP channel)", d.Lanes)
	}
	return nil
}

// mysqlOptions are the MySQL connection settings of c.
func (c *Config) mysqlOptions() mysqlconn.Options {
	return mysqlconn.Options{DSN: c.MySQLDSN, TLSCA: c.MySQLTLSCA, TLSCert: c.MySQLTLSCert, TLSKey: c.MySQLTLSKey,
		PasswordFile: c.MySQLPasswordFile}
}

// setDefault sets *v to d when it is zero (or, for numbers, negative).
func setDefault[T int | int64 | time.Duration | ~string](v *T, d T) {
	var zero T
	if *v <= zero {
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
