package relay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// setup gives a test a migrated database and its own exchange and queue.
func setup(t *testing.T) (*testenv.DB, *testenv.Broker) {
	t.Helper()
	db := testenv.MySQL(t)
	db.Migrate(testenv.Context(t, time.Minute), t)
	return db, testenv.RabbitMQ(t)
}

// relayNameFor is the relay name the tests' relays on database dbName run
// under. The tests run in parallel, most of them on the shared server, and
// a relay name's user locks (leadership, poll locks) are the server's, not
// the database's: relays of one name in two databases of one server would
// take turns as leader.
func relayNameFor(dbName string) string {
	sum := sha256.Sum256([]byte(dbName))
	return "test-" + hex.EncodeToString(sum[:8])
}

// startRelay runs a relay in this process until the test ends; stop shuts it
// down like SIGTERM and returns Run's error.
func startRelay(t *testing.T, db *testenv.DB, b *testenv.Broker, mod func(*Config)) (stop func() error) {
	t.Helper()
	_, stop = startRelayR(t, db, b, mod)
	return stop
}

// startRelayR is startRelay that also returns the relay, to watch its mode.
func startRelayR(t *testing.T, db *testenv.DB, b *testenv.Broker, mod func(*Config)) (*Relay, func() error) {
	t.Helper()
	cfg := Config{
		MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange,
		ServerID: testenv.ServerID(t), Logger: zaptest.NewLogger(t).Named("relay"),
		CheckpointInterval: time.Second, RelayName: relayNameFor(db.Name),
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("new relay: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(time.Minute):
				runErr = fmt.Errorf("relay did not stop within a minute of shutdown")
			}
			r.Close()
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	waitTailing(t, r, done)
	return r, stop
}

// waitTailing waits until the relay delivers live — reads the binlog past the
// first-start sweep, or polls — so what the test writes next goes through
// that path rather than the first-start sweep.
func waitTailing(t *testing.T, r *Relay, done chan error) {
	t.Helper()
	deadline := time.After(time.Minute)
	for !r.Tailing() && !r.Polling() {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("relay stopped before tailing: %v", err)
		case <-deadline:
			t.Fatal("relay neither tailing the binlog nor polling within a minute")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// consume attaches a validator to the broker's queue for the test's duration.
func consume(t *testing.T, b *testenv.Broker, queue string) *validator.Validator {
	t.Helper()
	v := validator.New()
	stop, err := validator.Consume(context.Background(), b.URL, queue, v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return v
}

// load describes a producer workload (see testload.Load).
type load struct {
	producers, partitions, total int
	bigTxn                       int     // rows of a large transaction
	bigShare                     float64 // probability that a transaction is a large one
	routingKey                   func(partition string) string
}

// produce writes l.total messages with testload.Produce; rows name b's
// exchange or leave it to the relay's default exchange (b's too).
func produce(ctx context.Context, t *testing.T, db *testenv.DB, b *testenv.Broker, v *validator.Validator, l load) {
	t.Helper()
	testload.Produce(ctx, t, db.SQL, v, testload.Load{
		Producers: l.producers, Partitions: l.partitions, Total: l.total,
		BigTxn: l.bigTxn, BigShare: l.bigShare, Exchange: b.Exchange, RoutingKey: l.routingKey,
	})
}

// waitRows waits until the query's count reaches want.
func waitRows(ctx context.Context, t *testing.T, db *testenv.DB, query string, want int) {
	t.Helper()
	testload.WaitRows(ctx, t, db.SQL, query, want)
}
