package publish

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// Defaults applied by Config.Validate.
const (
	DefaultConfirmWindow = 256
	DefaultMaxAttempts   = 5
	DefaultReconnectMin  = 100 * time.Millisecond
	DefaultReconnectMax  = 10 * time.Second

	// maxConfirmWindow keeps the per-channel notification buffers (sized to
	// the window) and the memory a window pins reasonable.
	maxConfirmWindow = 65535
)

// Config configures a Publisher.
type Config struct {
	// URL is the broker, amqp://user:pass@host:port/vhost (or amqps://).
	// The password never appears in errors or logs.
	URL string
	// Conn holds the TLS files and the password file, read again at every
	// dial (see ConnOptions).
	Conn ConnOptions
	// ConfirmWindow is the most messages a Channel holds without a Result
	// (published and not confirmed, parked behind an earlier message of
	// their key, or confirmed and waiting for an earlier message's Result).
	// Default 256.
	ConfirmWindow int
	// MaxAttempts is how many times a message the broker nacks is published
	// before it is reported Rejected. Default 5.
	MaxAttempts int
	// ReconnectMin and ReconnectMax bound the jittered exponential backoff
	// between dial attempts and channel reopens. Defaults 100ms and 10s.
	ReconnectMin, ReconnectMax time.Duration
	// Logger receives connection events. Default zap.NewNop().
	Logger *zap.Logger
	// OnReconnect, when set, is called after every successful redial (not
	// the first dial), for a reconnects metric. It must not block.
	OnReconnect func()
	// OnDial, when set, is called after every dial attempt, the first
	// included, with nil when it connected or else an error naming the
	// broker (redacted URL) and the cause. It must not block.
	OnDial func(err error)
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
	if c.URL == "" {
		return errors.New("publish config: URL is empty")
	}
	uri, err := amqp.ParseURI(c.URL)
	if err != nil {
		// A parse error quotes the URL, and a piece of the password where
		// it cut one out: redact.ParseError masks both.
		return fmt.Errorf("publish config: URL %s: %w", redact.URL(c.URL), redact.ParseError(err, c.URL))
	}
	if uri.Port < 1 || uri.Port > 65535 {
		return fmt.Errorf("publish config: URL %s: port %d out of range", redact.URL(c.URL), uri.Port)
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
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxAttempts < 1 {
		return fmt.Errorf("publish config: MaxAttempts %d must be at least 1", c.MaxAttempts)
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
