package poller_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/poller"
	"github.com/outbox-relay/outbox-relay/publish"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// env is a migrated database, the test's exchange and queue, a publisher
// and a progress row.
type env struct {
	db     *testenv.DB
	pool   *sql.DB // opened like the relay opens its pool: UTC sessions, parsed times
	broker *testenv.Broker
	pub    *publish.Publisher
	store  *checkpoint.Store
	epoch  int64
}

func setup(t testing.TB, onDelivered string) *env {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	db := testenv.MySQL(t)
	db.Migrate(ctx, t)
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ParseTime, cfg.Loc = true, time.UTC
	cfg.Params = map[string]string{"time_zone": "'+00:00'"}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pool := sql.OpenDB(conn)
	pool.SetMaxOpenConns(16)
	pool.SetMaxIdleConns(16) // else connections churn, each reconnect a SET time_zone
	t.Cleanup(func() { pool.Close() })

	b := testenv.RabbitMQ(t)
	pub, err := publish.New(context.Background(), publish.Config{URL: b.URL, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	store, err := checkpoint.New(pool, checkpoint.Config{OnDelivered: onDelivered})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.ExecContext(ctx, "INSERT INTO outbox_relay_progress (relay_name, epoch) VALUES ('default', 7)"); err != nil {
		t.Fatal(err)
	}
	return &env{db: db, pool: pool, broker: b, pub: pub, store: store, epoch: 7}
}

func (e *env) poller(t testing.TB, mod func(*poller.Config)) *poller.Poller {
	t.Helper()
	cfg := poller.Config{DefaultExchange: e.broker.Exchange, Logger: zap.NewNop()}
	if tt, ok := t.(*testing.T); ok {
		cfg.Logger = zaptest.NewLogger(tt, zaptest.Level(zap.InfoLevel)).Named("poller")
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := poller.New(e.pool, poller.AMQP(e.pub), e.store, e.epoch, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// run starts p.Run until the test ends; stop cancels it and returns Run's
// error. done is closed when Run has returned by itself or by stop.
func run(t *testing.T, p *poller.Poller) (stop func() error, done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	fin := make(chan struct{})
	var runErr error
	go func() {
		defer close(fin)
		runErr = p.Run(ctx)
	}()
	var (
		once    sync.Once
		stopErr error
		stopped bool // the test has seen Run's error
	)
	stopRun := func() error {
		once.Do(func() {
			cancel()
			select {
			case <-fin:
				stopErr = runErr
			case <-time.After(time.Minute):
				stopErr = fmt.Errorf("poller did not stop within a minute")
			}
		})
		return stopErr
	}
	stop = func() error {
		stopped = true
		return stopRun()
	}
	t.Cleanup(func() {
		// A round under way when the test ends is cut (rolled back): its
		// messages would be published again by the next run, which is
		// what a cancelled Run promises; the test's checks are done.
		err := stopRun()
		var cut *poller.CutError
		if err != nil && !stopped && !errors.As(err, &cut) {
			t.Errorf("poller: %v", err)
		}
	})
	return stop, fin
}

// consume attaches a validator to the broker's queue for the test's duration.
func consume(t *testing.T, b *testenv.Broker) *validator.Validator {
	t.Helper()
	v := validator.New()
	stop, err := validator.Consume(context.Background(), b.URL, b.Queue, v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return v
}

func count(ctx context.Context, t testing.TB, db *sql.DB, query string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// waitRows waits until the query's count reaches want.
func waitRows(ctx context.Context, t testing.TB, db *sql.DB, query string, want int) {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	for {
		n := count(ctx, t, db, query)
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

// load describes a producer workload (after relay/main_test.go).
type load struct {
	producers, partitions, total int
	bigTxn                       int     // rows of a large transaction
	bigShare                     float64 // share of rows written in large transactions
	noKey                        bool    // partition_key '' for every row
}

// produce writes l.total messages with testload (see testload.Load): rows
// name the test's exchange or leave it to the poller's default, which is
// the same; v, when not nil, is told each committed message.
func produce(ctx context.Context, t testing.TB, e *env, v *validator.Validator, l load) {
	t.Helper()
	testload.Produce(ctx, t, e.db.SQL, v, testload.Load{
		Producers: l.producers, Partitions: l.partitions, Total: l.total,
		BigTxn: l.bigTxn, BigShare: l.bigShare, NoKey: l.noKey, Exchange: e.broker.Exchange,
	})
}

// bulkLoad inserts n rows with 256-byte payloads spread over the given
// number of partitions ("" when 0), 1,000 rows per statement (for backlogs
// that are not validated message by message).
func bulkLoad(ctx context.Context, t testing.TB, db *sql.DB, n, partitions int) {
	t.Helper()
	payload := []byte(fmt.Sprintf("%0256d", 0))
	for done := 0; done < n; {
		rows := min(1000, n-done)
		q := make([]byte, 0, 64*rows)
		q = append(q, "INSERT INTO outbox (message_id, partition_key, routing_key, payload) VALUES "...)
		args := make([]any, 0, 4*rows)
		for i := range rows {
			if i > 0 {
				q = append(q, ',')
			}
			q = append(q, "(?,?,'bench',?)"...)
			var id [16]byte
			if _, err := rand.Read(id[:]); err != nil {
				t.Fatal(err)
			}
			key := ""
			if partitions > 0 {
				key = fmt.Sprintf("p%d", (done+i)%partitions)
			}
			args = append(args, id[:], key, payload)
		}
		if _, err := db.ExecContext(ctx, string(q), args...); err != nil {
			t.Fatalf("load %d rows: %v", n, err)
		}
		done += rows
	}
}
