package poller

import (
	"fmt"
	"regexp"
	"time"

	"github.com/outbox-relay/outbox-relay/metrics"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// Defaults applied by Config.Validate. Batch and Workers come from the
// drain benchmark (docs/poller.md): with the database and the broker on the
// same two cores, two workers of 500 rows drained fastest — one worker's
// database work overlaps the other's publishing — while four or eight
// workers were slower (they compete for the same CPU and, with 1,000
// partitions, for the same partition heads), and 1,000-row batches bought
// nothing. With the database on another machine (round trips, not CPU)
// more workers can pay off: measure with --poll-workers.
const (
	DefaultTable    = "outbox"
	DefaultInterval = 100 * time.Millisecond
	DefaultBatch    = 500
	DefaultWorkers  = 2

	// maxBatch keeps one round's statements (an IN list of up to
	// Batch*(Workers+1) ids) and its memory sane.
	maxBatch   = 10_000
	maxWorkers = 64
)

// Config configures a Poller.
type Config struct {
	// Table is the outbox table (--table); default "outbox". It must be the
	// table of the checkpoint.Store given to New.
	Table string
	// OnDelivered is "delete" (default) or "mark" (--on-delivered); it must
	// be the Store's, which does the acknowledging.
	OnDelivered string
	// Interval (--poll-interval, default 100ms) is how long worker 0 waits
	// before polling again after a round that found nothing pending and
	// due: an idle poller sends one statement per Interval (the other
	// workers wait until a round finds rows). A worker whose
	// candidates were all held by the other workers waits until one of them
	// commits, at most Interval.
	Interval time.Duration
	// Batch (--poll-batch, default 500) is the most rows one worker claims,
	// publishes and acknowledges in one database transaction; a round over
	// fewer than Batch/4 partitions may take up to 4 × Batch, within 16 MiB
	// past the first Batch (doc.go, step 4).
	Batch int
	// Workers (--poll-workers, default 2) is how many rounds run at once,
	// each worker on its own database transaction and AMQP channel.
	Workers int
	// DefaultExchange (--default-exchange) is used for rows whose exchange
	// is empty.
	DefaultExchange string
	// Logger receives round failures and retries; default zap.NewNop().
	Logger *zap.Logger
	// Metrics receives publish outcomes and the rounds' share of the
	// in-flight series (AddInflight); nil records nothing.
	Metrics *metrics.Metrics
	// Leading reports whether this process may still publish: the relay
	// passes its leader's leadership.Leader.Valid (leadership held and the
	// lease not expired). Every round (Run's, Drain's and the
	// DelayedSweeper's) calls it once it has claimed its rows and before it
	// publishes any of them. False rolls the round back unpublished, its rows
	// unlocked and still pending, and ends the call: Run (and Drain, Round)
	// returns an error wrapping leadership.ErrLeaseExpired. So a leader that
	// was stopped past its lease publishes no row committed after it
	// stopped, even if it claims one before it notices. It must be cheap and
	// safe for concurrent use; nil means always true.
	Leading func() bool
}

var identRE = regexp.MustCompile(`^[A-Za-z0-9_$]{1,64}$`)

// Validate applies the defaults to zero fields and checks the rest.
func (c *Config) Validate() error {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if !identRE.MatchString(c.Table) {
		return fmt.Errorf("poller config: table name %q: use letters, digits, _ and $ only (at most 64)", c.Table)
	}
	switch c.OnDelivered {
	case "":
		c.OnDelivered = checkpoint.Delete
	case checkpoint.Delete, checkpoint.Mark:
	default:
		return fmt.Errorf("poller config: on-delivered %q: want %q or %q", c.OnDelivered, checkpoint.Delete, checkpoint.Mark)
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Interval < time.Millisecond {
		return fmt.Errorf("poller config: poll interval %v: want at least 1ms", c.Interval)
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if c.Batch < 1 || c.Batch > maxBatch {
		return fmt.Errorf("poller config: poll batch %d out of range 1..%d", c.Batch, maxBatch)
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Workers < 1 || c.Workers > maxWorkers {
		return fmt.Errorf("poller config: poll workers %d out of range 1..%d", c.Workers, maxWorkers)
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}
