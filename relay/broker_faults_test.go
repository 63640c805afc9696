package relay

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// The relay's AMQP connection is cut three times through a fault proxy while
// 8,000 messages flow (the second time the proxy also refuses connections
// for a second): every message arrives, first deliveries stay in commit order
// per partition, and the outbox ends empty.
func TestRelaySurvivesBrokerCut(t *testing.T) {
	t.Parallel()
	const total = 8_000
	db, b := setup(t)
	v := consume(t, b, b.Queue) // directly on the broker: only the relay's connection is cut
	proxy := testenv.Proxy(t, brokerAddr(t, b.URL))
	startRelay(t, db, b, func(c *Config) { c.AMQPURL = viaProxy(t, b.URL, proxy.Addr()) })
	ctx := testenv.WorkContext(t)

	// The faults come from their own goroutine, each once the consumer has
	// seen a given number of messages, so they hit the stream while it
	// flows; the producers keep writing meanwhile.
	type fault struct {
		at     int           // distinct messages seen before it
		refuse time.Duration // also refuse connections this long
	}
	faults := []fault{{at: 1_000}, {at: 3_000, refuse: time.Second}, {at: 5_000}}
	injected := make(chan error, 1)
	go func() {
		injected <- func() error {
			for i, f := range faults {
				if err := pollUntil(ctx, func() bool { return distinct(v) >= f.at }); err != nil {
					return fmt.Errorf("fault %d: only %d messages arrived, waited for %d: %w", i+1, distinct(v), f.at, err)
				}
				seen := distinct(v)
				if seen >= total {
					return fmt.Errorf("fault %d came after the stream ended (%d messages arrived): it proves nothing", i+1, seen)
				}
				if f.refuse == 0 {
					proxy.Cut()
					t.Logf("fault %d: cut the relay's AMQP connection after %d messages", i+1, seen)
					continue
				}
				proxy.Disable()
				// The outage's length is the point here, not a condition.
				time.Sleep(f.refuse)
				proxy.Enable()
				t.Logf("fault %d: cut the relay's AMQP connection after %d messages and refused connections for %v",
					i+1, seen, f.refuse)
			}
			return nil
		}()
	}()

	began := time.Now()
	produce(ctx, t, db, b, v, load{producers: 8, partitions: 100, total: total, bigTxn: 500, bigShare: 0.5})
	select {
	case err := <-injected:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatalf("faults not injected in time: %d messages arrived", distinct(v))
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("all %d messages arrived %v after the first write; %d duplicates",
		total, time.Since(began).Round(time.Millisecond), v.Duplicates())
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox_failed", 0)
}

// The broker itself is stopped while the relay publishes a backlog, stays
// down while producers keep writing, and is started again: nothing is lost,
// first deliveries stay in commit order per partition, and the outbox ends
// empty. The queue is durable and the messages persistent, so what the broker
// confirmed before it stopped is still there after the restart.
func TestRelaySurvivesBrokerRestart(t *testing.T) {
	// Parallel with TestRelayOnCluster (its own relay name) and
	// TestIdleRelayStatements (its own server): the only parallel test
	// under the default relay name on the shared server.
	t.Parallel()
	const backlog, duringOutage = 5_000, 1_000
	node := testenv.StartRabbitMQ(t)
	b := node.Broker(t)
	db := testenv.MySQL(t)
	db.Migrate(testenv.Context(t, time.Minute), t)
	v := consume(t, b, b.Queue)
	startRelay(t, db, b, nil)
	ctx := testenv.WorkContext(t)

	// Mostly large transactions: the backlog is written faster than the
	// broker takes it, so the relay is mid-stream when the broker stops.
	produce(ctx, t, db, b, v, load{producers: 8, partitions: 100, total: backlog, bigTxn: 500, bigShare: 0.9})
	waitReceived(ctx, t, v, 1_500)
	before := distinct(v)
	if before >= backlog {
		t.Fatalf("the stream ended (%d messages arrived) before the broker could be stopped: the test would prove nothing", before)
	}
	down := time.Now()
	node.Stop(t)
	stopped := time.Since(down)

	// Producers keep writing while the broker is down: the relay reads
	// these rows and holds them until it can publish.
	produce(ctx, t, db, b, v, load{producers: 8, partitions: 100, total: duringOutage, bigTxn: 50, bigShare: 0.5})
	var pending int
	if err := db.SQL.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&pending); err != nil {
		t.Fatal(err)
	}
	node.Start(t)
	outage := time.Since(down)
	t.Logf("broker stopped after %d messages arrived (stop took %v), down %v; %d rows written meanwhile, %d pending when it came back",
		before, stopped.Round(time.Millisecond), outage.Round(time.Millisecond), duringOutage, pending)

	// The consumer's connection died with the broker; attach another to the
	// same validator (its observations accumulate).
	stopConsume, err := validator.Consume(context.Background(), b.URL, b.Queue, v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopConsume)

	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("all %d messages arrived %v after the broker came back; %d duplicates",
		backlog+duringOutage, (time.Since(down) - outage).Round(time.Millisecond), v.Duplicates())
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox_failed", 0)
}

// distinct is the number of different messages v has seen.
func distinct(v *validator.Validator) int { return v.Received() - v.Duplicates() }

// pollUntil polls cond until it holds, for one step of a test: it fails when
// cond has not held for progress.Patience, or ctx ends.
func pollUntil(ctx context.Context, cond func() bool) error {
	return progress.Wait(ctx, "wait for a condition", nil, cond)
}

// pollWhile polls cond until it holds while measure moves: it fails when
// measure has not moved for progress.Patience, or ctx ends.
func pollWhile(ctx context.Context, measure func() float64, cond func() bool) error {
	return progress.Wait(ctx, "wait for a condition", func() int64 { return int64(measure()) }, cond)
}

// brokerAddr is the host:port of an AMQP URL.
func brokerAddr(t *testing.T, url string) string {
	t.Helper()
	u, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatalf("parse AMQP URL: %v", err)
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}

// viaProxy is url with its host:port replaced by addr.
func viaProxy(t *testing.T, url, addr string) string {
	t.Helper()
	u, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatalf("parse AMQP URL: %v", err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("proxy address %q: %v", addr, err)
	}
	u.Host = host
	if u.Port, err = strconv.Atoi(port); err != nil {
		t.Fatalf("proxy address %q: %v", addr, err)
	}
	return u.String()
}
