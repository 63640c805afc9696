package relay

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// The heap test's stream: heapTxns one-row transactions, the live heap read
// after a collection every heapStep of them, once the relay delivered them,
// past the first heapWarmUp (pools, buffers and windows reaching their
// steady size).
const (
	heapTxns   = 22_000
	heapStep   = 1_000
	heapWarmUp = 6_000
	// heapMaxSlope is the most the live heap may grow per 100,000
	// transactions. A relay keeping every MariaDB GTID it published grows by
	// about 3.3 MiB per 100,000 (issue 31: 38 MiB per million); a relay
	// whose state follows what is in flight stays flat, give or take what
	// happens to be in flight at each reading, and of a buffer that grows
	// once to a larger steady size (a step, not a slope).
	heapMaxSlope = 1 << 20
)

// TestRelayHeapFlatOverTransactions passes a stream of one-row
// transactions, each of a partition key of its own, through a relay in this
// process (default flags: no state file) into a queue that keeps only its
// newest messages, and fails when the live heap (runtime/metrics
// /gc/heap/live:bytes after runtime.GC, read with nothing in flight) grows
// with the transactions: both
// the least-squares slope over the readings and the median of the
// increments from one reading to the next (which a single step, a buffer
// reaching a larger steady size, does not move; growth per transaction
// moves every increment) above heapMaxSlope per 100,000 transactions. The
// same in poll mode and with a state file. The relay must have delivered
// every row by the end.
func TestRelayHeapFlatOverTransactions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mode      Mode
		stateFile bool
	}{
		{"binlog", ModeBinlog, false},
		{"poll", ModePoll, false},
		{"binlog with a state file", ModeBinlog, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, b := setup(t)
			b.UnbindQueue(t)
			b.DeclareQueueArgs(t, "#", amqp.Table{"x-max-length": int64(1000)})
			ctx := testenv.WorkContext(t)
			startRelay(t, db, b, func(c *Config) {
				c.Mode, c.Logger = tc.mode, zap.NewNop() // zaptest keeps every line in memory
				c.CheckpointInterval = 0
				if tc.stateFile {
					c.StateFile = filepath.Join(t.TempDir(), "relay.state")
				}
			})
			readings := heapOverStream(ctx, t, db)
			waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
			slope, median := heapSlope(readings)*100_000, heapMedianIncrement(readings)*100_000
			first, last := readings[0], readings[len(readings)-1]
			t.Logf("readings (transactions:live heap): %v", readings)
			t.Logf("%s: live heap %.2f MiB after %d transactions, %.2f MiB after %d; per 100,000 transactions: %+.3f MiB (least squares), %+.3f MiB (median increment); at most %.1f",
				tc.name, first.live/(1<<20), first.txns, last.live/(1<<20), last.txns, slope/(1<<20), median/(1<<20), float64(heapMaxSlope)/(1<<20))
			if slope > heapMaxSlope && median > heapMaxSlope {
				t.Errorf("the live heap grows by %.2f MiB per 100,000 transactions (median increment %.2f; at most %.1f): readings %v",
					slope/(1<<20), median/(1<<20), float64(heapMaxSlope)/(1<<20), readings)
			}
		})
	}
}

// heapReading is the live heap after a collection once txns transactions
// were committed.
type heapReading struct {
	txns int
	live float64
}

func (r heapReading) String() string { return fmt.Sprintf("%d:%.2fMiB", r.txns, r.live/(1<<20)) }

// heapOverStream commits heapTxns one-row transactions from four
// connections in rounds of heapStep. After each round past heapWarmUp it
// waits until the relay delivered every row (nothing in flight: what the
// heap holds then is what the relay keeps between transactions), then
// reads the live heap after a collection (the lowest of three).
func heapOverStream(ctx context.Context, t *testing.T, db *testenv.DB) []heapReading {
	t.Helper()
	var readings []heapReading
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	for done := 0; done < heapTxns; done += heapStep {
		if err := heapRound(ctx, db, done); err != nil {
			t.Fatal(err)
		}
		if done+heapStep < heapWarmUp {
			continue
		}
		waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
		live := math.Inf(1)
		for range 3 { // an idle poll round may hold a buffer at one reading
			runtime.GC()
			metrics.Read(sample)
			live = min(live, float64(sample[0].Value.Uint64()))
		}
		readings = append(readings, heapReading{txns: done + heapStep, live: live})
	}
	return readings
}

// heapRound commits heapStep one-row transactions, numbered from first, each
// with a partition key of its own, from four connections, and returns when
// all four are done.
func heapRound(ctx context.Context, db *testenv.DB, first int) error {
	const writers = 4
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := first + w; i < first+heapStep; i += writers {
				msg := outbox.Message{PartitionKey: fmt.Sprintf("heap-%d", i), RoutingKey: "heap", Payload: []byte(`{"n":1}`)}
				if _, err := outbox.Enqueue(ctx, db.SQL, msg); err != nil {
					errs <- fmt.Errorf("transaction %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when no writer failed
}

// heapSlope is the least-squares slope of the live heap over the
// transactions, in bytes per transaction.
func heapSlope(rs []heapReading) float64 {
	var sx, sy, sxx, sxy float64
	n := float64(len(rs))
	for _, r := range rs {
		x := float64(r.txns)
		sx, sy, sxx, sxy = sx+x, sy+r.live, sxx+x*x, sxy+x*r.live
	}
	if den := n*sxx - sx*sx; den > 0 {
		return (n*sxy - sx*sy) / den
	}
	return 0
}

// heapMedianIncrement is the median of the increments from one reading to
// the next, in bytes per transaction.
func heapMedianIncrement(rs []heapReading) float64 {
	var inc []float64
	for i := 1; i < len(rs); i++ {
		inc = append(inc, (rs[i].live-rs[i-1].live)/float64(rs[i].txns-rs[i-1].txns))
	}
	if len(inc) == 0 {
		return 0
	}
	slices.Sort(inc)
	return inc[len(inc)/2]
}
