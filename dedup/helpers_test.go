package dedup_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/dedup"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(streamChildEnv) != "" { // a consumer process of TestStreamConsumerKilledProcess
		os.Exit(streamChild())
	}
	os.Exit(testenv.Main(m))
}

// schemaDB returns a fresh database with the relay's schema (the inbox
// tables among it) and a table effects, where handlers write one row per
// run: counting its rows counts the effects, duplicates included.
func schemaDB(t testing.TB) *testenv.DB {
	t.Helper()
	db := testenv.MySQL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db.Migrate(ctx, t)
	if _, err := db.SQL.ExecContext(ctx, `CREATE TABLE effects (
		id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
		message_id BINARY(16) NOT NULL,
		note VARCHAR(255) NOT NULL DEFAULT '')`); err != nil {
		t.Fatal(err)
	}
	return db
}

// effect is the handlers' business write: one row in effects.
func effect(ctx context.Context, tx *sql.Tx, messageID string) error {
	id, err := uuid.Parse(messageID)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO effects (message_id) VALUES (?)", id[:])
	return err
}

// effectCounts returns how many effect rows each message id (text) has.
func effectCounts(t testing.TB, db *sql.DB) map[string]int {
	t.Helper()
	rows, err := db.Query("SELECT message_id, COUNT(*) FROM effects GROUP BY message_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	counts := map[string]int{}
	for rows.Next() {
		var id []byte
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		u, err := uuid.FromBytes(id)
		if err != nil {
			t.Fatal(err)
		}
		counts[u.String()] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return counts
}

// count runs a COUNT(*) query.
func count(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// newIDs returns n fresh message ids (UUIDv7 text, as the relay sends them).
func newIDs(t testing.TB, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		u, err := uuid.NewV7()
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = u.String()
	}
	return ids
}

// msg is one message as the relay would publish it.
type msg struct {
	id, typ, key string
	outboxID     int64
	headers      amqp.Table // the producer's own headers
	body         string
	createdAt    time.Time
}

// dial connects to url; the connection is closed at cleanup.
func dial(t testing.TB, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("connect to RabbitMQ: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// channel opens a channel on conn.
func channel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	return ch
}

// publish sends msgs to b's exchange with the relay's properties and
// headers (docs/wire.md) and waits for the broker's confirms, so they are all
// in b.Queue when it returns.
func publish(t testing.TB, b *testenv.Broker, msgs ...msg) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := dial(t, b.URL)
	defer conn.Close()
	ch := channel(t, conn)
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm mode: %v", err)
	}
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		h := amqp.Table{"x-outbox-id": m.outboxID, "x-relay-epoch": int64(1)}
		for k, v := range m.headers {
			h[k] = v
		}
		if m.key != "" {
			h["x-partition-key"] = m.key
		}
		at := m.createdAt
		if at.IsZero() {
			at = time.Now().UTC()
		}
		h["x-created-at"] = at.UTC().Format("2006-01-02T15:04:05.000000Z")
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, b.Exchange, "orders."+m.typ, true, false, amqp.Publishing{
			MessageId: m.id, Type: m.typ, ContentType: "application/json", DeliveryMode: amqp.Persistent,
			Timestamp: at, Headers: h, Body: []byte(m.body),
		})
		if err != nil {
			t.Fatalf("publish %s: %v", m.id, err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

// brokerAddr returns the host:port of an AMQP URL.
func brokerAddr(t testing.TB, url string) string {
	t.Helper()
	u, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}

// proxyURL is url with its host and port replaced by addr's.
func proxyURL(t testing.TB, url, addr string) string {
	t.Helper()
	u, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	if u.Port, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	u.Host = host
	return u.String()
}

// queueDepth returns how many messages are ready in the queue.
func queueDepth(t testing.TB, url, queue string) int {
	t.Helper()
	return inspect(t, url, queue).Messages
}

// inspect returns the queue's ready messages and consumers.
func inspect(t testing.TB, url, queue string) amqp.Queue {
	t.Helper()
	conn := dial(t, url)
	defer conn.Close()
	ch := channel(t, conn)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect queue %s: %v", queue, err)
	}
	return q
}

// running is a Consumer running in a goroutine on a connection of its own.
type running struct {
	c      *dedup.Consumer
	conn   *amqp.Connection
	cancel context.CancelFunc
	done   chan error
}

// start runs c on a new connection to url until stop (or the test's end).
func start(t testing.TB, url string, c *dedup.Consumer) *running {
	t.Helper()
	conn := dial(t, url)
	ch := channel(t, conn)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, conn: conn, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx, ch) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends Run and returns its result; later calls return nil.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Consumer.Run did not return within 30 s of its context's end")
		return nil
	}
}

// waitFor polls cond until it holds or d passes; then it fails the test
// with what describes the state.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; %s", what, d, state())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// calls counts handler runs per message id, safe for concurrent use.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *calls) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

func (c *calls) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for id, n := range c.n {
		fmt.Fprintf(&b, "%s:%d ", id, n)
	}
	return b.String()
}
