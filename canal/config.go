package canal

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// Defaults applied by Config.Validate.
const (
	DefaultPort            = 3306
	DefaultHeartbeatPeriod = 5 * time.Second
	DefaultEventCacheCount = 64
	DefaultRetryMin        = 200 * time.Millisecond
	DefaultRetryMax        = 5 * time.Second
)

// Config configures a Tailer. Every connection the tailer opens (the binlog
// stream, the flavor detection, CheckConnection) uses Host, Port, User,
// Password (or PasswordFunc) and TLS directly with go-mysql's own client;
// Preflight checks the grants of the *sql.DB it is given, which should log in
// as the same user with the same TLS settings.
type Config struct {
	Host     string
	Port     int // default 3306
	User     string
	Password string
	// PasswordFunc, if set, is asked for the password before each new
	// connection, and Password is ignored: a rotated password (a re-read
	// password file) needs no restart. An error fails that connection
	// attempt, which Run retries like a refused connection.
	PasswordFunc func() (string, error)
	// TLS, if set, encrypts every connection with this configuration (its
	// RootCAs and ServerName verify the server unless InsecureSkipVerify;
	// its Certificates authenticate the client); nil is plain TCP. It is not
	// modified.
	TLS *tls.Config
	// TLSPreferred, with TLS set, connects without TLS to a server that
	// does not offer it, as go-sql-driver's tls=preferred does.
	TLSPreferred bool

	// ServerID is our replica server id; it must be unique among the server's
	// replicas and differ from the server's own @@server_id. Two binlog
	// clients with one id make the server drop the older connection.
	ServerID uint32
	// Flavor is "mysql" or "mariadb"; "" detects it from the server version
	// when Run connects (or takes the start position's flavor).
	Flavor string
	// Schema and Table name the outbox table to decode; every other table's
	// rows are skipped undecoded. Compared case-insensitively.
	Schema, Table string

	// HeartbeatPeriod asks the server for a heartbeat event when idle, so a
	// silent network drop is noticed by ReadTimeout. Default 5s; must be less
	// than ReadTimeout.
	HeartbeatPeriod time.Duration
	// ReadTimeout ends a read that saw nothing, not even a heartbeat, for this
	// long; the stream is then reconnected. Default 3*HeartbeatPeriod.
	// go-mysql arms it at the start of each read, so a Handler that blocks
	// (back-pressure) does not trip it; a block longer than the server's
	// net_write_timeout (60s by default) makes the server drop the dump,
	// which costs a reconnect and a skipped re-read, nothing else.
	ReadTimeout time.Duration
	// EventCacheCount is go-mysql's decoded-event buffer between its reader
	// goroutine and Run. Small keeps memory bounded. Default 64.
	EventCacheCount int

	// RetryMin and RetryMax bound the jittered exponential backoff between
	// reconnects after transient errors. Defaults 200ms and 5s.
	RetryMin, RetryMax time.Duration

	// OnRetry, if set, is called from Run's goroutine before each reconnect
	// with the error that ended the stream and the number of consecutive
	// failures since the stream last yielded a row or a transaction (1 for
	// the first failure after progress). A connection that lives long but
	// yields nothing does not start the count over; a handler blocking on
	// what it was handed does not count against the stream. The relay uses
	// it for its reconnect metric and to decide when binlog trouble has
	// lasted long enough to fall back to polling (it then cancels Run's
	// context). It must not block for long.
	OnRetry func(err error, attempt int)

	// CheckServer, if set, is called from Run's goroutine before every dump
	// after the first of a Run: a reconnect may reach another server than
	// the one the stream started on (a VIP or proxy moved by a failover).
	// An error wrapped in a *StopError ends Run with that error; any other
	// error counts as a failed connection and is retried.
	CheckServer func(ctx context.Context) error

	// CheckDumpServer, if set, is called from Run's goroutine with the
	// server_id in the header of the first event of every dump, the first
	// dump of a Run included, before any other event of it is handled: the
	// artificial ROTATE both MySQL and MariaDB send first carries the
	// server_id of the server the binlog connection is on (unlike a query
	// over another connection, it cannot have reached another server). An
	// error wrapped in a *StopError ends Run with that error; any other
	// error counts as a failed connection and is retried.
	CheckDumpServer func(serverID uint32) error

	// OnServerIDUnchecked, if set, receives Preflight's reason, in words,
	// when it cannot check ServerID against the server's other replicas
	// (the user may not list them), instead of the warning Preflight logs
	// otherwise. The relay runs Preflight at every re-probe of the binlog
	// and reports this once per process.
	OnServerIDUnchecked func(reason string)

	// OwnServerID, if set, is asked by Preflight when a binlog client is
	// registered with ServerID: true means that client is this program's
	// own (the relay: the leader of the same relay name, another process
	// started with the same flags), so it is no clash. Only the leader
	// reads the binlog; a standby's Preflight must not refuse it.
	OwnServerID func(ctx context.Context) bool

	Logger *zap.Logger // default zap.NewNop()
}

// Validate checks c and fills in the defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.Host == "" {
		errs = append(errs, errors.New("Host is empty"))
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("Port %d is out of range", c.Port))
	}
	if c.User == "" {
		errs = append(errs, errors.New("User is empty"))
	}
	if c.ServerID == 0 {
		errs = append(errs, errors.New("ServerID is 0: choose a replica server id unique among the server's replicas"))
	}
	switch c.Flavor {
	case "", FlavorMySQL, FlavorMariaDB:
	default:
		errs = append(errs, fmt.Errorf("Flavor %q: want %q, %q or empty to detect", c.Flavor, FlavorMySQL, FlavorMariaDB))
	}
	if c.Schema == "" || c.Table == "" {
		errs = append(errs, errors.New("Schema and Table must name the outbox table"))
	}
	if c.HeartbeatPeriod == 0 {
		c.HeartbeatPeriod = DefaultHeartbeatPeriod
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 3 * c.HeartbeatPeriod
	}
	if c.HeartbeatPeriod < 0 || c.ReadTimeout < 0 {
		errs = append(errs, errors.New("HeartbeatPeriod and ReadTimeout must be positive"))
	} else if c.HeartbeatPeriod >= c.ReadTimeout {
		errs = append(errs, fmt.Errorf("HeartbeatPeriod %v must be less than ReadTimeout %v, or an idle stream times out", c.HeartbeatPeriod, c.ReadTimeout))
	}
	if c.EventCacheCount == 0 {
		c.EventCacheCount = DefaultEventCacheCount
	}
	if c.EventCacheCount < 0 {
		errs = append(errs, fmt.Errorf("EventCacheCount %d is negative", c.EventCacheCount))
	}
	if c.RetryMin == 0 {
		c.RetryMin = DefaultRetryMin
	}
	if c.RetryMax == 0 {
		c.RetryMax = DefaultRetryMax
	}
	if c.RetryMin < 0 || c.RetryMax < c.RetryMin {
		errs = append(errs, fmt.Errorf("retry backoff %v..%v: want 0 < RetryMin <= RetryMax", c.RetryMin, c.RetryMax))
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("canal config: %w", err)
	}
	return nil
}
