package publish

import (
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// Defaults applied by Config.Validate.
const (
	DefaultConfirmWindow = 256
	DefaultMaxHeldBytes  = 16 << 20
	DefaultMaxAttempts   = 5
	DefaultReconnectMin  = 100 * time.Millisecond
	DefaultReconnectMax  = 10 * time.Second
	DefaultNackGiveUp    = 30 * time.Second
	// DefaultConfirmStuckAfter: see Config.ConfirmStuckAfter.
	DefaultConfirmStuckAfter = 2 * time.Minute

	// maxConfirmWindow keeps the per-channel notification buffers (sized to
	// the window) and the memory a window pins reasonable.
	maxConfirmWindow = 65535
)

// Config configures a Publisher.
type Config struct {
	// URL is the broker, amqp://user:pass@host:port/vhost (or amqps://),
	// or several brokers separated by commas (the nodes of a cluster; see
	// SplitURLs): New connects to the first that answers, and after a lost
	// connection the Publisher dials the next ones in turn. The password
	// never appears in errors or logs.
	URL string
	// Conn holds the TLS files and the password file, read again at every
	// dial (see ConnOptions).
	Conn ConnOptions
	// ConfirmWindow is the most messages a Channel has on the wire: sent
	// (or to be sent again after a reconnect) and without a Result. Only
	// a key's head and messages without a key go on the wire, so messages
	// parked behind an earlier message of their key, and messages whose
	// Result waits for an earlier Result of their key, do not count:
	// MaxHeldBytes bounds them. A Channel thus keeps as many distinct keys
	// on the wire as its caller offers, up to the window. Default 256.
	ConfirmWindow int
	// MaxHeldBytes bounds what a Channel holds without a delivered Result
	// (on the wire, parked, or waiting for an earlier Result of its key),
	// counting each message's Size (its body and 160 bytes when Size is
	// 0). A message larger than the bound is taken when nothing else is
	// held.
	// Default 16 MiB.
	MaxHeldBytes int64
	// MaxAttempts is how many times a message the broker nacks is published
	// before it is reported Rejected, provided the broker has been nacking
	// it for NackGiveUp at least; also how many times the broker may close
	// the whole connection over a message's frames (501, 502, 505) while
	// it alone is on the wire, over NackGiveUp at least, before it is
	// reported Returned with the close's code. Default 5.
	MaxAttempts int
	// MaxMessageSize is the largest body the broker takes, its
	// max_message_size: AMQP 0-9-1 does not tell it to a client. A message
	// with a larger body is not sent; it is resolved Returned (Code 311).
	// Default DefaultMaxMessageSize, RabbitMQ 3.10's default.
	MaxMessageSize int64
	// NackGiveUp is the least time from a message's first nack to its
	// Rejected Result (and from the first connection closed over it to its
	// Returned Result), however many attempts that takes: a quorum queue
	// nacks every publish while it elects a leader (seconds), and such a
	// message must not be given up. A nacked message is published again at
	// once the first time, then after a backoff from ReconnectMin doubling
	// to ReconnectMax. Default 30s.
	NackGiveUp time.Duration
	// ConfirmStuckAfter is how long a connection that is up and not
	// blocked (connection.blocked: a resource alarm) may go without any
	// confirmation while messages are on the wire (ConfirmWait) before the
	// Publisher closes it and dials again, its Channels publishing the
	// unconfirmed messages again on the new one (at least once: a message
	// the broker took without confirming is then stored twice). RabbitMQ
	// before 4.2 can leave a channel's publishes to a quorum queue
	// unconfirmed for good after a node outage (the queue's client in the
	// channel never resends a lost command, and the queue waits for it);
	// a quorum queue without a majority for longer than this also sees its
	// publishers reconnect. Default DefaultConfirmStuckAfter.
	ConfirmStuckAfter time.Duration
	// ReconnectMin and ReconnectMax bound the jittered exponential backoff
	// between dial attempts and channel reopens. Defaults 100ms and 10s.
	ReconnectMin, ReconnectMax time.Duration
	// Logger receives connection events. Default zap.NewNop().
	Logger *zap.Logger
	// OnReconnect, when set, is called after every successful redial (not
	// the first dial) with the node connected to (host:port), for a
	// reconnects metric. It must not block.
	OnReconnect func(node string)
	// OnDial, when set, is called after every dial attempt, the first
	// included, with the node dialled (host:port) and nil when it connected,
	// or else an error naming the broker (redacted URL) and the cause. It
	// must not block.
	OnDial func(node string, err error)
	// RetryRefused makes New succeed when the broker refuses the user,
	// password or vhost (ACCESS_REFUSED, NOT_ALLOWED) or TLS fails (see
	// IsRefused): the Publisher keeps
	// redialling in the background as for an unreachable broker, so an
	// operator can fix the broker without the caller giving up what it holds.
	RetryRefused bool
	// Tracer, when set, makes one span per message: started when Publish
	// accepts it, ended when its Result is delivered (confirm, return or
	// reject). nil (the default) makes none and costs nothing.
	Tracer trace.Tracer
}

// Validate applies the defaults to zero fields and checks the rest. Errors
// name the URL in redacted form only.
func (c *Config) Validate() error {
	if _, err := SplitURLs(c.URL); err != nil {
		return fmt.Errorf("publish config: %w", err)
	}
	if err := c.Conn.Check(c.URL); err != nil {
		return fmt.Errorf("publish config: %w", err)
	}
	if c.ConfirmWindow == 0 {
		c.ConfirmWindow = DefaultConfirmWindow
	}
	if c.ConfirmWindow < 1 || c.ConfirmWindow > maxConfirmWindow {
		return fmt.Errorf("publish config: ConfirmWindow %d out of range 1..%d", c.ConfirmWindow, maxConfirmWindow)
	}
	if c.MaxHeldBytes == 0 {
		c.MaxHeldBytes = DefaultMaxHeldBytes
	}
	if c.MaxHeldBytes < 0 {
		return fmt.Errorf("publish config: MaxHeldBytes %d must be positive", c.MaxHeldBytes)
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxAttempts < 1 {
		return fmt.Errorf("publish config: MaxAttempts %d must be at least 1", c.MaxAttempts)
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = DefaultMaxMessageSize
	}
	if c.MaxMessageSize < 0 {
		return fmt.Errorf("publish config: MaxMessageSize %d must be positive (the broker's max_message_size in bytes)", c.MaxMessageSize)
	}
	if c.NackGiveUp == 0 {
		c.NackGiveUp = DefaultNackGiveUp
	}
	if c.NackGiveUp < 0 {
		return fmt.Errorf("publish config: NackGiveUp %v must not be negative", c.NackGiveUp)
	}
	if c.ConfirmStuckAfter == 0 {
		c.ConfirmStuckAfter = DefaultConfirmStuckAfter
	}
	if c.ConfirmStuckAfter < 0 {
		return fmt.Errorf("publish config: ConfirmStuckAfter %v must not be negative", c.ConfirmStuckAfter)
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = DefaultReconnectMin
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = DefaultReconnectMax
	}
	if c.ReconnectMin < 0 || c.ReconnectMax < c.ReconnectMin {
		return fmt.Errorf("publish config: reconnect backoff %v..%v: want 0 < min <= max", c.ReconnectMin, c.ReconnectMax)
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}
