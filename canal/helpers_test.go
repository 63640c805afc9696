package canal

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// setupOutbox creates the outbox table (through the migrations package, so
// the tests decode the real schema) and a foreign table "other".
func setupOutbox(t testing.TB, db *testenv.DB) {
	t.Helper()
	ctx := testCtx(t)
	db.Migrate(ctx, t)
	if _, err := db.SQL.ExecContext(ctx, "CREATE TABLE other (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(50)) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
}

// tailerConfig is a Config for db with short timeouts so tests notice faults fast.
func tailerConfig(t testing.TB, db *testenv.DB) Config {
	return Config{
		Host: db.Host, Port: db.Port, User: db.User, Password: db.Password,
		ServerID:        testenv.ServerID(t),
		Schema:          db.Name,
		Table:           "outbox",
		HeartbeatPeriod: 300 * time.Millisecond,
		ReadTimeout:     2 * time.Second,
		RetryMin:        20 * time.Millisecond,
		RetryMax:        300 * time.Millisecond,
		Logger:          zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	}
}

// writer is one connection in UTC, as producers are expected to write.
func writer(t testing.TB, db *sql.DB) *sql.Conn {
	t.Helper()
	ctx := testCtx(t)
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.ExecContext(ctx, "SET time_zone = '+00:00'"); err != nil {
		t.Fatal(err)
	}
	return c
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// insertRecords writes recs (all columns but id) in one statement.
func insertRecords(ctx context.Context, db execer, recs []*outbox.Record) error {
	var q strings.Builder
	q.WriteString("INSERT INTO outbox (message_id, partition_key, exchange, routing_key, message_type, headers, payload, content_type, created_at, available_at) VALUES ")
	args := make([]any, 0, len(recs)*10)
	for i, r := range recs {
		if i > 0 {
			q.WriteString(",")
		}
		q.WriteString("(?,?,?,?,?,?,?,?,?,?)")
		var headers, avail any
		if r.Headers != nil {
			headers = string(r.Headers)
		}
		if !r.AvailableAt.IsZero() {
			avail = r.AvailableAt
		}
		args = append(args, r.MessageID[:], r.PartitionKey, r.Exchange, r.RoutingKey, r.MessageType,
			headers, r.Payload, r.ContentType, r.CreatedAt, avail)
	}
	_, err := db.ExecContext(ctx, q.String(), args...)
	return err
}

// newRecords makes n records with the awkward values: message ids ending in
// 0x00 bytes, payloads with 0x00, UTF-8 partition keys, NULL and non-NULL
// headers and available_at.
func newRecords(n int) []*outbox.Record {
	base := time.Now().UTC().Truncate(time.Microsecond)
	recs := make([]*outbox.Record, n)
	for i := range recs {
		r := &outbox.Record{
			PartitionKey: fmt.Sprintf("заказ-ü-🚀-%d", i%7),
			Exchange:     "events",
			RoutingKey:   fmt.Sprintf("order.%d", i),
			MessageType:  "order.placed",
			Payload:      []byte(fmt.Sprintf("{\"n\":%d}\x00\x01\x00tail", i)),
			ContentType:  "application/json",
			CreatedAt:    base.Add(time.Duration(i) * time.Microsecond),
		}
		rand.Read(r.MessageID[:])
		switch i % 5 {
		case 0:
			clear(r.MessageID[13:]) // three trailing zero bytes
		case 1:
			clear(r.MessageID[4:]) // twelve
		}
		if i%3 != 0 {
			r.Headers = []byte(fmt.Sprintf(`{"k": "v%d", "n": %d, "ok": true}`, i, i))
		}
		if i%4 == 0 {
			r.AvailableAt = base.Add(time.Hour + time.Duration(i)*time.Microsecond)
		}
		if i%9 == 0 {
			r.Payload = []byte{}
		}
		recs[i] = r
	}
	return recs
}

// fillIDs sets the ID of each record from the table, by message id.
func fillIDs(t testing.TB, db *sql.DB, recs []*outbox.Record) {
	t.Helper()
	rows, err := db.QueryContext(testCtx(t), "SELECT id, message_id FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ids := map[outbox.MessageID]uint64{}
	for rows.Next() {
		var id uint64
		var mid []byte
		if err := rows.Scan(&id, &mid); err != nil {
			t.Fatal(err)
		}
		ids[outbox.MessageID(mid)] = id
	}
	for _, r := range recs {
		if id, ok := ids[r.MessageID]; ok {
			r.ID = id
		}
	}
}

// collector is a Handler that keeps everything and checks the call shape.
type collector struct {
	mu      sync.Mutex
	recs    []*outbox.Record
	txns    []collected
	cur     int // rows since the last Commit
	err     error
	onRow   func(n, cur int) // called with the rows so far and since the last Commit, outside the lock
	rowWait time.Duration    // a slow handler: each Row takes this long (a stimulus, not a wait for a condition)
}

type collected struct {
	pos  position.Position
	rows int
}

func (c *collector) Row(ctx context.Context, rec *outbox.Record) error {
	if c.rowWait > 0 {
		time.Sleep(c.rowWait)
	}
	c.mu.Lock()
	c.recs = append(c.recs, rec)
	c.cur++
	n, cur := len(c.recs), c.cur
	c.mu.Unlock()
	if c.onRow != nil {
		c.onRow(n, cur)
	}
	return nil
}

func (c *collector) Commit(ctx context.Context, pos position.Position, rows int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rows < c.cur && c.err == nil {
		c.err = fmt.Errorf("Commit(%s) says %d rows, Row was called %d times since the last Commit", pos, rows, c.cur)
	}
	c.cur = 0
	c.txns = append(c.txns, collected{pos, rows})
	return nil
}

func (c *collector) snapshot() ([]*outbox.Record, []collected) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*outbox.Record(nil), c.recs...), append([]collected(nil), c.txns...)
}

func (c *collector) lastPos() (position.Position, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.txns) == 0 {
		return position.Position{}, false
	}
	return c.txns[len(c.txns)-1].pos, true
}

// running is a Run in its own goroutine.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

func startRun(t testing.TB, tl *Tailer, from position.Position, h Handler) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = tl.Run(ctx, from, h)
	}()
	t.Cleanup(func() { r.stop() })
	return r
}

// stop cancels Run and returns its error (nil for the expected ctx.Err()).
func (r *running) stop() error {
	r.cancel()
	<-r.done
	if errors.Is(r.err, context.Canceled) {
		return nil
	}
	return r.err
}

// exited reports Run's error if it has returned.
func (r *running) exited() (error, bool) {
	select {
	case <-r.done:
		return r.err, true
	default:
		return nil, false
	}
}

// covers reports whether MariaDB position p has reached end in every domain.
func covers(t testing.TB, p, end position.Position) bool {
	have, err := position.ParseGTIDSet(FlavorMariaDB, p.GTIDSet)
	if err != nil {
		t.Fatal(err)
	}
	want, err := position.ParseGTIDSet(FlavorMariaDB, end.GTIDSet)
	if err != nil {
		t.Fatal(err)
	}
	return have.Contain(want)
}

// waitCovered waits until c has committed a position at or past end.
func waitCovered(t testing.TB, r *running, c *collector, end position.Position, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if p, ok := c.lastPos(); ok && covers(t, p, end) {
			return
		}
		if err, ok := r.exited(); ok {
			t.Fatalf("Run returned early: %v", err)
		}
		if time.Now().After(deadline) {
			p, _ := c.lastPos()
			t.Fatalf("timed out waiting for position %s; last commit %s", end, p)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func currentPosition(t testing.TB, db *sql.DB) position.Position {
	t.Helper()
	p, err := CurrentPosition(testCtx(t), db)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sameRecord compares every field.
func sameRecord(a, b *outbox.Record) bool {
	return a.ID == b.ID && a.MessageID == b.MessageID && a.PartitionKey == b.PartitionKey &&
		a.Exchange == b.Exchange && a.RoutingKey == b.RoutingKey && a.MessageType == b.MessageType &&
		bytes.Equal(a.Headers, b.Headers) && (a.Headers == nil) == (b.Headers == nil) &&
		bytes.Equal(a.Payload, b.Payload) && a.ContentType == b.ContentType &&
		a.CreatedAt.Equal(b.CreatedAt) && a.CreatedAt.Location() == time.UTC &&
		a.AvailableAt.Equal(b.AvailableAt) && (a.AvailableAt.IsZero() || a.AvailableAt.Location() == time.UTC)
}
