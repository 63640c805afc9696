package progress

import (
	"context"
	"fmt"
	"time"
)

// Patience is how long a wait may see nothing move before it fails. It is
// generous on purpose: beside a whole test suite on two cores a RabbitMQ node
// has taken 90 s to restart, and a relay goes quiet for the length of a
// reconnect backoff; neither is stuck. It bounds each step of a workload,
// never the whole of it.
const Patience = 3 * time.Minute

// Interval is how often Wait looks.
const Interval = 50 * time.Millisecond

// Stalled is the error of a wait that saw nothing move for Patience.
type Stalled struct {
	What  string        // what was waited for
	Value int64         // the progress measure when it stalled
	For   time.Duration // how long it had not moved
}

func (e *Stalled) Error() string {
	return fmt.Sprintf("%s: nothing moved for %v (progress stuck at %d)", e.What, e.For.Round(time.Second), e.Value)
}

// Wait calls done every Interval until it reports true, and returns nil then;
// measure is called first each time, so done may read what it computed.
// measure reports how far the work has come (messages received, rows left,
// anything that changes while it advances); Wait returns a *Stalled error when
// measure has reported the same value for Patience, and ctx's error when ctx
// ends first. A nil measure makes done's own flip the only progress: the wait
// is then bounded by Patience as a whole, which suits a single step (a
// reconnect, a mode change), not a workload.
func Wait(ctx context.Context, what string, measure func() int64, done func() bool) error {
	return WaitPatience(ctx, Patience, what, measure, done)
}

// WaitPatience is Wait with patience in place of Patience (for the tests of
// this package, and for a caller whose step is known to be short).
func WaitPatience(ctx context.Context, patience time.Duration, what string, measure func() int64, done func() bool) error {
	if measure == nil {
		measure = func() int64 { return 0 }
	}
	t := time.NewTicker(Interval)
	defer t.Stop()
	last, moved := measure(), time.Now()
	for !done() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-t.C:
		}
		if v := measure(); v != last {
			last, moved = v, time.Now()
		} else if still := time.Since(moved); still >= patience {
			return &Stalled{What: what, Value: v, For: still}
		}
	}
	return nil
}

// Step is ctx bounded by Patience, for one step of a test that has no
// measure of its own to watch (a log line, a status, a metric reaching a
// value): the step fails when it has not happened within Patience, however
// long the whole workload around it runs.
func Step(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, Patience)
}
