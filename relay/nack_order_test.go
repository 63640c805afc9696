package relay

import (
	"context"
	"math"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// The relay in binlog mode publishing into a length-limited queue that
// refuses what does not fit (reject-publish), drained by a slow consumer:
// the broker nacks publishes all the time and frees room between a nack and
// the next publish. With MaxAttempts high nothing goes to outbox_failed,
// every message arrives once, and the first deliveries of each partition
// come in commit order.
func TestRelayNackedKeepsOrderPerKey(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	queue := b.DeclareQueueArgs(t, "#", amqp.Table{"x-max-length": int64(20), "x-overflow": "reject-publish"})
	// Only the limited queue may receive the exchange's messages: a publish
	// b.Queue took and the limited queue refused is nacked and published
	// again, a copy in b.Queue each time.
	b.UnbindQueue(t)
	v := consumeSlowly(t, b, queue, time.Millisecond)
	startRelay(t, db, b, func(c *Config) {
		c.Mode = ModeBinlog
		c.MaxAttempts = math.MaxInt32
		// Every nack is logged; thousands of them would bury the test output.
		c.Logger = zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)).Named("relay")
	})
	ctx := testenv.WorkContext(t)

	produce(ctx, t, db, b, v, load{producers: 3, partitions: 30, total: 3_000, bigTxn: 100, bigShare: 0.3})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	// A nacked publish is not enqueued: nothing arrives twice.
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox_failed", 0)
}

// consumeSlowly feeds queue's deliveries to a new validator like consume,
// but one message at a time, each acknowledged delay after it arrived: a
// consumer slower than the relay, so that a length-limited queue stays full.
// The sleep is the consumer's work, not a wait for a condition.
func consumeSlowly(t *testing.T, b *testenv.Broker, queue string, delay time.Duration) *validator.Validator {
	t.Helper()
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatalf("consumer: connect: %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatalf("consumer: open channel: %v", err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		conn.Close()
		t.Fatalf("consumer: set prefetch: %v", err)
	}
	deliveries, err := ch.Consume(queue, "", false, true, false, false, nil)
	if err != nil {
		conn.Close()
		t.Fatalf("consumer: consume %s: %v", queue, err)
	}
	v := validator.New()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			v.Observe(d)
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			_ = d.Ack(false)
		}
	}()
	t.Cleanup(func() {
		cancel()
		conn.Close()
		<-done
	})
	return v
}
