package relay

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// nextServerID gives each relay in this test binary its own replica id: two
// binlog readers with one id make the server drop the older one.
var nextServerID atomic.Uint32

func init() { nextServerID.Store(900_000) }

func testContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// setup gives a test a migrated database and its own exchange and queue.
func setup(t *testing.T) (*testenv.DB, *testenv.Broker) {
	t.Helper()
	db := testenv.MySQL(t)
	if _, err := migrations.Apply(testContext(t, time.Minute), db.SQL, migrations.Options{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return db, testenv.RabbitMQ(t)
}

// startRelay runs a relay in this process until the test ends; stop shuts it
// down like SIGTERM and returns Run's error.
func startRelay(t *testing.T, db *testenv.DB, b *testenv.Broker, mod func(*Config)) (stop func() error) {
	t.Helper()
	cfg := Config{
		MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange,
		ServerID: nextServerID.Add(1), Logger: zaptest.NewLogger(t).Named("relay"),
		CheckpointInterval: time.Second,
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
	stop = func() error {
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
	return stop
}

// waitTailing waits until the relay reads the binlog live, so what the test
// writes next goes through the binlog path rather than the first-start sweep.
func waitTailing(t *testing.T, r *Relay, done chan error) {
	t.Helper()
	deadline := time.After(time.Minute)
	for !r.Tailing() {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("relay stopped before tailing: %v", err)
		case <-deadline:
			t.Fatal("relay not tailing the binlog within a minute")
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

// load describes a producer workload.
type load struct {
	producers, partitions, total int
	bigTxn                       int     // rows of a large transaction
	bigShare                     float64 // share of rows written in large transactions
	routingKey                   func(partition string) string
}

// produce writes l.total messages from l.producers goroutines. Partition p
// belongs to producer p % producers, so each partition's commit order is its
// producer's order, which the validator is told after every commit. Payloads
// contain 0x00 bytes; about one row in 50 gets a message id ending in 0x00
// bytes (go-mysql strips those unless the relay pads them).
func produce(ctx context.Context, t *testing.T, db *testenv.DB, b *testenv.Broker, v *validator.Validator, l load) {
	t.Helper()
	if l.routingKey == nil {
		l.routingKey = func(p string) string { return "rk." + p }
	}
	per := l.total / l.producers
	var wg sync.WaitGroup
	errs := make(chan error, l.producers)
	for w := 0; w < l.producers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []string
			for p := w; p < l.partitions; p += l.producers {
				mine = append(mine, fmt.Sprintf("part-%03d-ü", p))
			}
			seq := 0
			for seq < per {
				n := 1
				if randN(1000) < int(l.bigShare*1000) {
					n = min(l.bigTxn, per-seq)
				}
				exp, err := writeTxn(ctx, db, b, l, w, mine, seq, n)
				if err != nil {
					errs <- fmt.Errorf("producer %d: %w", w, err)
					return
				}
				v.Expect(exp...)
				seq += n
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func writeTxn(ctx context.Context, db *testenv.DB, b *testenv.Broker, l load, w int, parts []string, seq, n int) ([]validator.Expected, error) {
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		pk := parts[randN(len(parts))]
		exchange := ""
		if (seq+i)%2 == 0 {
			exchange = b.Exchange
		}
		msgs[i] = outbox.Message{
			PartitionKey: pk, Exchange: exchange, RoutingKey: l.routingKey(pk), MessageType: "test.event",
			Headers: map[string]any{"producer": int64(w), "seq": int64(seq + i), "flag": true, "note": "ünï"},
			Payload: []byte(fmt.Sprintf("\x00{\"p\":%d,\"seq\":%d}\x00\x00", w, seq+i)),
		}
	}
	// About one row in 50 is inserted by hand with a message id ending in
	// zero bytes; the others go through Enqueue. Rows keep their order.
	ids := make([]outbox.MessageID, 0, n)
	var batch []outbox.Message
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		got, err := outbox.Enqueue(ctx, tx, batch...)
		ids = append(ids, got...)
		batch = batch[:0]
		return err
	}
	for _, m := range msgs {
		if randN(50) != 0 {
			batch = append(batch, m)
			continue
		}
		if err := flush(); err != nil {
			return nil, err
		}
		var id outbox.MessageID
		if _, err := rand.Read(id[:14]); err != nil {
			return nil, err
		}
		headers, err := json.Marshal(m.Headers)
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO outbox (message_id, partition_key, exchange, routing_key,
			message_type, headers, payload) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			id[:], m.PartitionKey, m.Exchange, m.RoutingKey, m.MessageType, headers, m.Payload); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	exp := make([]validator.Expected, n)
	for i, m := range msgs {
		ex := m.Exchange
		if ex == "" {
			ex = b.Exchange
		}
		exp[i] = validator.Expected{
			ID: ids[i], PartitionKey: m.PartitionKey, Exchange: ex, RoutingKey: m.RoutingKey,
			MessageType: m.MessageType, Payload: m.Payload, Headers: m.Headers,
		}
	}
	return exp, nil
}

func randN(n int) int {
	v, err := rand.Int(rand.Reader, big.NewInt(int64(n)))
	if err != nil {
		panic(err)
	}
	return int(v.Int64())
}

// waitRows waits until the query's count reaches want.
func waitRows(ctx context.Context, t *testing.T, db *testenv.DB, query string, want int) {
	t.Helper()
	var n int
	for {
		if err := db.SQL.QueryRowContext(ctx, query).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		if n == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s = %d, want %d", query, n, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
