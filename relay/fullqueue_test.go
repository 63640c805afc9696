package relay

import (
	"context"
	"math"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// fullQueueLength is the length of the queue kept full in
// TestRelayFullQueueHoldsBackOnlyItsKey.
const fullQueueLength = 50

// One queue kept full holds back only its own key. Key A's routing key is
// bound to a queue of 50 that refuses what does not fit
// (x-overflow=reject-publish), with no consumer, while A's producer writes
// a row every 20 ms: the broker nacks A's head again and again (never given
// up: MaxAttempts is unbounded, so the queue stays full for the whole
// test). Meanwhile 20,000 messages of 200 other keys, routed to another
// queue, all arrive, exactly once and in commit order per key, and their
// rows are acknowledged, while the full queue still holds its 50 with A's
// rows still pending. Then a consumer drains the full queue, and A's
// messages arrive too, in order.
//
// Before the fix, a Channel handed Results over in publish order across
// keys: the confirmed messages behind A's nacked head never reached the
// tracker, the lanes' byte budget was spent, and every lane stopped.
func TestRelayFullQueueHoldsBackOnlyItsKey(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	// b.Queue would take A's messages too: each nacked publish would leave
	// a copy there.
	b.UnbindQueue(t)
	others := b.DeclareQueue(t, "other.#")
	full := b.DeclareQueueArgs(t, "full.#", amqp.Table{"x-max-length": int64(fullQueueLength), "x-overflow": "reject-publish"})
	v := consume(t, b, others)
	startRelay(t, db, b, func(c *Config) {
		c.Mode = ModeBinlog
		c.MaxAttempts = math.MaxInt32
		// Every nack is logged; thousands of them would bury the test output.
		c.Logger = zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)).Named("relay")
	})
	ctx := testenv.WorkContext(t)

	// Key A's producer writes on until the end of the test.
	vA := validator.New()
	stopA, doneA := make(chan struct{}), make(chan error, 1)
	go func() {
		doneA <- testload.Run(ctx, db.SQL, vA, testload.Load{
			Producers: 1, Partitions: 1, PartitionOffset: 900, Total: 1, Pace: 20 * time.Millisecond, Until: stopA,
			Exchange: b.Exchange, RoutingKey: func(p string) string { return "full." + p },
		})
	}()
	stoppedA := false
	stopProducerA := func() {
		if !stoppedA {
			stoppedA = true
			close(stopA)
			if err := <-doneA; err != nil {
				t.Errorf("key A's producer: %v", err)
			}
		}
	}
	defer stopProducerA()
	depth := queueDepth(t, b, full)
	if err := progress.Wait(ctx, "fill key A's queue", depth, func() bool { return depth() == fullQueueLength }); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	produce(ctx, t, db, b, v, load{producers: 4, partitions: 200, total: 20_000, bigTxn: 50, bigShare: 0.2,
		routingKey: func(p string) string { return "other." + p }})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatalf("other keys beside the full queue: %v", err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	// The other keys' rows are acknowledged (their budget freed) while A
	// is held.
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox WHERE partition_key NOT LIKE 'part-900-%'", 0)
	// A was held back all along: its queue is still full and none of its
	// rows was given up.
	if n := depth(); n != fullQueueLength {
		t.Fatalf("key A's queue holds %d messages, want it still full (%d)", n, fullQueueLength)
	}
	var pendingA, failed int
	if err := db.SQL.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE partition_key = ?", "part-900-ü").Scan(&pendingA); err != nil {
		t.Fatal(err)
	}
	if err := db.SQL.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox_failed").Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if pendingA == 0 || failed != 0 {
		t.Fatalf("%d rows of key A pending, %d in outbox_failed; want A's rows waiting, none failed", pendingA, failed)
	}
	t.Logf("%d messages of 200 keys arrived within %v of the first write while key A's queue stayed full with %d of A's rows pending",
		v.ExpectedCount(), time.Since(began).Round(time.Millisecond), pendingA)

	// Once its queue is drained, A moves on, in order.
	stopProducerA()
	stopFull, err := validator.Consume(context.Background(), b.URL, full, vA)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopFull)
	if err := vA.WaitComplete(ctx); err != nil {
		t.Fatalf("key A after its queue was drained: %v", err)
	}
	if err := vA.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
}

// queueDepth returns a function that reads how many messages queue holds
// (ready and unacknowledged), failing the test when it cannot.
func queueDepth(t *testing.T, b *testenv.Broker, queue string) func() int64 {
	t.Helper()
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatalf("connect to read the depth of %s: %v", queue, err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open a channel to read the depth of %s: %v", queue, err)
	}
	return func() int64 {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Errorf("read the depth of %s: %v", queue, err)
			return -1
		}
		return int64(q.Messages)
	}
}
