package replay

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/mysqlconn"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Defaults applied by Config.Validate.
const (
	DefaultLanes            = 2
	DefaultConfirmWindow    = 256
	DefaultMaxAttempts      = 5
	DefaultProgressInterval = 5 * time.Second
	DefaultFlushTimeout     = 30 * time.Second

	// MinRate is the lowest Rate other than 0 (unlimited): one message in
	// 1000 s. Lower rates would wait longer than a time.Duration holds.
	MinRate = 0.001

	// A replay's default server id is drawn from [minServerID, minServerID
	// + serverIDSpan): outside the relay's default range (7,364,000 plus
	// less than 100,000), and random per replay so that two replays at once
	// do not take each other's binlog connection either.
	minServerID  = 7_464_000
	serverIDSpan = 1_000_000
)

// Config configures one replay.
type Config struct {
	MySQLDSN string // go-sql-driver form user:pass@tcp(host:port)/db; the user needs REPLICATION SLAVE, REPLICATION CLIENT and SELECT on outbox_relay_progress
	// AMQPURL is the broker: one URL, or several separated by commas (the
	// nodes of a cluster, publish.SplitURLs), dialled in turn until one
	// answers. Ignored by a dry run.
	AMQPURL string
	// AMQPOptions are the TLS files and the password file for AMQPURL.
	AMQPOptions publish.ConnOptions
	Table       string // outbox table; default "outbox"
	// RelayName is the relay whose current epoch the messages carry in
	// x-relay-epoch (read from its progress row; 0 when it has none).
	// Default "default".
	RelayName string
	// ServerID is the replica server id the replay reads the binlog as.
	// It must differ from every other binlog reader of the server, the
	// relay's above all (the server would drop the older connection).
	// 0 picks a random one in [7,464,000, 8,464,000).
	ServerID        uint32
	DefaultExchange string // exchange for rows whose exchange is ''
	// Exchange, when set, replaces every message's exchange.
	Exchange string

	// MySQLTLSCA, MySQLTLSCert, MySQLTLSKey and MySQLPasswordFile are as
	// relay.Config's: PEM files of the CA that signed the server's
	// certificate and of a client certificate and its key; a file holding
	// the password (MySQLDSN then has none), read at each new connection.
	// They and the DSN's tls parameter hold for the binlog reader too.
	MySQLTLSCA, MySQLTLSCert, MySQLTLSKey string
	MySQLPasswordFile                     string

	Range  Range
	Filter Filter
	// DryRun publishes nothing; the Summary says what would have been.
	DryRun bool
	// Rate limits publishing to this many messages per second; 0 is
	// unlimited. Otherwise at least MinRate; NaN and infinities are refused.
	Rate float64

	Lanes         int // AMQP channels; default 2
	ConfirmWindow int // unconfirmed messages per channel; default 256
	MaxAttempts   int // broker nacks before a message counts as rejected; default 5
	// FlushTimeout bounds the wait for outstanding confirms after an
	// interrupted replay (ctx ended). Default 30s.
	FlushTimeout time.Duration

	// OnProgress, if set, receives a Progress every ProgressInterval
	// (default 5s) from a goroutine of Run, and once more at the end. It
	// must not block for long.
	OnProgress       func(Progress)
	ProgressInterval time.Duration

	Logger *zap.Logger // default zap.NewNop()
}

// Range is the part of the binlog to replay. Exactly one of FromGTID and
// FromTime is set; at most one of ToGTID and ToTime.
type Range struct {
	// FromGTID is a position (a GTID set, like a checkpoint): the replay
	// starts with the transaction after it.
	FromGTID string
	// FromTime starts with the first transaction whose binlog event time,
	// in whole seconds, is at or after it (truncated to the second).
	FromTime time.Time
	// ToGTID ends the replay with the transaction that completes the set
	// (inclusive).
	ToGTID string
	// ToTime ends it before the first transaction whose event time is
	// after it (in whole seconds: events of ToTime's second are included).
	ToTime time.Time
	// Without ToGTID and ToTime the replay ends at the server's position
	// when it started.
}

// Filter selects rows; an empty Filter takes every row. The conditions add up.
type Filter struct {
	PartitionKeys    []string // the row's partition_key is one of these
	RoutingKeyPrefix string   // the row's routing_key starts with this
	MessageType      string   // the row's message_type is this
}

// mysqlOptions are the MySQL connection settings of c.
func (c *Config) mysqlOptions() mysqlconn.Options {
	return mysqlconn.Options{DSN: c.MySQLDSN, TLSCA: c.MySQLTLSCA, TLSCert: c.MySQLTLSCert, TLSKey: c.MySQLTLSKey,
		PasswordFile: c.MySQLPasswordFile}
}

func (f *Filter) match(rec *outbox.Record) bool {
	if len(f.PartitionKeys) > 0 {
		ok := false
		for _, k := range f.PartitionKeys {
			if rec.PartitionKey == k {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if !strings.HasPrefix(rec.RoutingKey, f.RoutingKeyPrefix) {
		return false
	}
	return f.MessageType == "" || rec.MessageType == f.MessageType
}

// RefusedError is a replay the server or the request rules out: a start
// that is purged or not in the server's history, an end not reached yet, an
// empty or reversed range, a server that cannot serve the binlog. The CLI
// exits 2 on it. Its message says what to do.
type RefusedError struct{ Err error }

func (e *RefusedError) Error() string { return e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

func refused(format string, a ...any) error { return &RefusedError{fmt.Errorf(format, a...)} }

// Validate fills in defaults and checks the values; errors are
// *RefusedError.
func (c *Config) Validate() error {
	if c.MySQLDSN == "" {
		return refused("replay: the MySQL DSN is empty")
	}
	target, err := mysqlconn.New(c.mysqlOptions())
	if err != nil {
		if _, perr := mysql.ParseDSN(c.MySQLDSN); perr != nil {
			return refused("replay: the MySQL DSN does not parse (want user:pass@tcp(host:port)/db)")
		}
		return refused("replay: %v", err)
	}
	if target.DBName() == "" {
		return refused("replay: the MySQL DSN names no database: add it after the slash, e.g. user:pass@tcp(host:3306)/app")
	}
	if !c.DryRun {
		// Checked here, with the password kept out of the message, before
		// anything dials it.
		pc := publish.Config{URL: c.AMQPURL, Conn: c.AMQPOptions}
		if err := pc.Validate(); err != nil {
			return refused("replay: %v", err)
		}
	}
	if c.Table == "" {
		c.Table = outbox.DefaultTable
	}
	if _, err := outbox.QuoteTable(c.Table); err != nil {
		return refused("replay: table: %v", err)
	}
	if c.RelayName == "" {
		c.RelayName = "default"
	}
	if c.ServerID == 0 {
		c.ServerID = minServerID + rand.Uint32N(serverIDSpan)
	}
	r := &c.Range
	switch {
	case r.FromGTID == "" && r.FromTime.IsZero():
		return refused("replay: give the start of the range: Range.FromGTID SET or Range.FromTime T")
	case r.FromGTID != "" && !r.FromTime.IsZero():
		return refused("replay: give one start, Range.FromGTID or Range.FromTime, not both")
	case r.ToGTID != "" && !r.ToTime.IsZero():
		return refused("replay: give at most one end, Range.ToGTID or Range.ToTime, not both")
	case !r.FromTime.IsZero() && !r.ToTime.IsZero() && r.ToTime.Truncate(time.Second).Before(r.FromTime.Truncate(time.Second)):
		return refused("replay: Range.ToTime %s is before Range.FromTime %s", r.ToTime.Format(time.RFC3339), r.FromTime.Format(time.RFC3339))
	}
	if len(c.Exchange) > 255 {
		return refused("replay: exchange %.40q... is %d bytes, AMQP allows 255", c.Exchange, len(c.Exchange))
	}
	if math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) || c.Rate < 0 || c.Rate > 0 && c.Rate < MinRate {
		return refused("replay: rate %v: want 0 (unlimited) or a number of messages per second of at least %v", c.Rate, MinRate)
	}
	if c.Lanes == 0 {
		c.Lanes = DefaultLanes
	}
	if c.ConfirmWindow == 0 {
		c.ConfirmWindow = DefaultConfirmWindow
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Lanes < 1 || c.ConfirmWindow < 1 || c.MaxAttempts < 1 {
		return refused("replay: lanes %d, confirm window %d and max attempts %d must be positive", c.Lanes, c.ConfirmWindow, c.MaxAttempts)
	}
	if c.FlushTimeout <= 0 {
		c.FlushTimeout = DefaultFlushTimeout
	}
	if c.ProgressInterval <= 0 {
		c.ProgressInterval = DefaultProgressInterval
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}
