package leadership

import (
	"database/sql"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// Defaults of Config, exported so that the relay and the CLI's flags
// declare the same.
const (
	DefaultHeartbeatInterval = 2 * time.Second
	// DefaultLeaderLease is the lease of the default heartbeat; an unset
	// LeaderLease is LeaderLeaseFor(HeartbeatInterval).
	DefaultLeaderLease = 10 * time.Second
	// DefaultLockWatch is Config.LockWatch's default: one statement per
	// five minutes on an idle leader's lock connection.
	DefaultLockWatch = 5 * time.Minute
)

// LeaderLeaseFor is the default lease of a heartbeat interval:
// DefaultLeaderLease, or 5 heartbeats when that is longer.
func LeaderLeaseFor(heartbeat time.Duration) time.Duration {
	return max(DefaultLeaderLease, 5*heartbeat)
}

// Config says whose leadership this is and how it is kept. Zero values
// take the defaults above (SetDefaults).
type Config struct {
	RelayName string // default checkpoint.DefaultRelayName
	// Table is the outbox table the relay name publishes (default
	// checkpoint.DefaultTable). A leader holds the table's lock
	// (checkpoint.TableLockName) beside the name's for its whole term, so
	// no two relay names lead one table (Acquire, TableLedError).
	Table             string
	Instance          string        // leader_instance and the outbox_relay_instances row; default host:pid
	HeartbeatInterval time.Duration // leadership heartbeat; default DefaultHeartbeatInterval
	LeaderLease       time.Duration // a leader without a heartbeat this long is taken over; default LeaderLeaseFor(HeartbeatInterval), at least 3 heartbeats
	Logger            *zap.Logger   // where Acquire says it waits out a previous leader's lease; default none
	// LockWatch is how long each wait of a leader's lock connection lasts
	// (one DO SLEEP each; its end, a kill or a cut, ends leadership at
	// once); default DefaultLockWatch.
	LockWatch time.Duration
}

// SetDefaults fills the zero values of c with the defaults.
func (c *Config) SetDefaults() {
	if c.RelayName == "" {
		c.RelayName = checkpoint.DefaultRelayName
	}
	if c.Table == "" {
		c.Table = checkpoint.DefaultTable
	}
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.LeaderLease <= 0 {
		c.LeaderLease = LeaderLeaseFor(c.HeartbeatInterval)
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.LockWatch <= 0 {
		c.LockWatch = DefaultLockWatch
	}
}

// Validate checks c with its defaults filled (SetDefaults); it changes
// nothing. Errors name the Config fields.
func (c *Config) Validate() error {
	d := *c
	d.SetDefaults()
	if err := checkpoint.CheckRelayName(d.RelayName); err != nil {
		return err
	}
	if _, err := outbox.QuoteTable(d.Table); err != nil {
		return fmt.Errorf("Config.Table: %w", err)
	}
	if d.LeaderLease < 3*d.HeartbeatInterval {
		return fmt.Errorf("Config.LeaderLease %v is shorter than 3 heartbeat intervals (%v): a leader would lose it between two heartbeats",
			d.LeaderLease, 3*d.HeartbeatInterval)
	}
	return nil
}

// Elector takes and keeps one relay name's leadership for this process
// (Acquire) and records the process in outbox_relay_instances
// (BeatInstance). Use one Elector for every term of a process: it
// remembers the epoch of its last released term, so its next Acquire
// does not wait out its own lease.
type Elector struct {
	db  *sql.DB
	cfg Config

	mu       sync.Mutex
	released int64     // the epoch of the last leader of this elector that was released: its term is over
	pruned   time.Time // when BeatInstance last deleted long-dead instances
}

// New returns an elector over db, which must reach the database holding
// the progress table.
func New(db *sql.DB, cfg Config) (*Elector, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("leadership config: %w", err)
	}
	return &Elector{db: db, cfg: cfg}, nil
}

// Config returns the validated configuration.
func (s *Elector) Config() Config { return s.cfg }
