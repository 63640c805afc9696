package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// schemaDB returns a fresh database with the outbox schema applied.
func schemaDB(t *testing.T, opts migrations.Options) *sql.DB {
	t.Helper()
	db := testenv.MySQL(t).SQL
	if _, err := migrations.Apply(context.Background(), db, opts); err != nil {
		t.Fatalf("apply migrations: %v", err)
	}
	return db
}

// countingExecer counts statements, to check "one INSERT per call".
type countingExecer struct {
	outbox.Execer
	mu    sync.Mutex
	execs int
}

func (c *countingExecer) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	c.mu.Lock()
	c.execs++
	c.mu.Unlock()
	return c.Execer.ExecContext(ctx, q, args...)
}

type row struct {
	id                                            uint64
	messageID                                     outbox.MessageID
	partitionKey, exchange, routingKey, typ, ctyp string
	headers                                       sql.NullString
	payload                                       []byte
	createdAt                                     time.Time
	availableAt                                   sql.NullTime
}

func readRows(t *testing.T, db *sql.DB, table string) []row {
	t.Helper()
	// The testenv DSN has no parseTime: read times as text and parse them.
	rows, err := db.Query(`SELECT id, message_id, partition_key, exchange, routing_key, message_type,
		headers, payload, content_type, created_at, available_at FROM ` + table + ` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []row
	for rows.Next() {
		var r row
		var mid []byte
		var created string
		var avail sql.NullString
		if err := rows.Scan(&r.id, &mid, &r.partitionKey, &r.exchange, &r.routingKey, &r.typ,
			&r.headers, &r.payload, &r.ctyp, &created, &avail); err != nil {
			t.Fatal(err)
		}
		if len(mid) != 16 {
			t.Fatalf("message_id is %d bytes", len(mid))
		}
		copy(r.messageID[:], mid)
		if r.createdAt, err = time.Parse("2006-01-02 15:04:05.999999", created); err != nil {
			t.Fatal(err)
		}
		if avail.Valid {
			at, err := time.Parse("2006-01-02 15:04:05.999999", avail.String)
			if err != nil {
				t.Fatal(err)
			}
			r.availableAt = sql.NullTime{Time: at, Valid: true}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func countRows(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func checkV7(t *testing.T, id outbox.MessageID) {
	t.Helper()
	if id[6]>>4 != 7 || id[8]>>6 != 0b10 {
		t.Fatalf("id %s is not a UUIDv7 (version %d, variant %02b)", id, id[6]>>4, id[8]>>6)
	}
}

// message i of a test batch: UTF-8 keys, NUL bytes in the payload, headers.
func testMessage(i int) outbox.Message {
	return outbox.Message{
		PartitionKey: fmt.Sprintf("注文-ü-%d", i%7),
		Exchange:     "orders",
		RoutingKey:   fmt.Sprintf("order.placed.%d", i),
		MessageType:  "order.placed",
		Headers:      map[string]any{"tenant": "äö", "n": i, "vip": i%2 == 0, "ratio": 0.25},
		Payload:      append([]byte{0, 0, byte(i), 0xff, 0}, []byte(fmt.Sprintf(`{"i":%d}`, i))...),
		ContentType:  []string{"", "application/octet-stream"}[i%2],
	}
}

func checkReadBack(t *testing.T, msgs []outbox.Message, ids []outbox.MessageID, got []row, start time.Time) {
	t.Helper()
	if len(got) != len(msgs) || len(ids) != len(msgs) {
		t.Fatalf("%d rows, %d ids for %d messages", len(got), len(ids), len(msgs))
	}
	for i, r := range got {
		m := msgs[i]
		if r.messageID != ids[i] {
			t.Fatalf("row %d: message_id %s, want %s (rows must follow msgs order)", i, r.messageID, ids[i])
		}
		checkV7(t, ids[i])
		if i > 0 && bytes.Compare(ids[i-1][:], ids[i][:]) >= 0 {
			t.Fatalf("ids %d and %d not increasing", i-1, i)
		}
		if r.partitionKey != m.PartitionKey || r.exchange != m.Exchange || r.routingKey != m.RoutingKey || r.typ != m.MessageType {
			t.Fatalf("row %d: strings differ: %+v vs %+v", i, r, m)
		}
		wantCT := m.ContentType
		if wantCT == "" {
			wantCT = outbox.DefaultContentType
		}
		if r.ctyp != wantCT {
			t.Fatalf("row %d: content_type %q, want %q", i, r.ctyp, wantCT)
		}
		if !bytes.Equal(r.payload, m.Payload) && !(len(m.Payload) == 0 && len(r.payload) == 0) {
			t.Fatalf("row %d: payload %x, want %x", i, r.payload, m.Payload)
		}
		if len(m.Headers) == 0 {
			if r.headers.Valid {
				t.Fatalf("row %d: headers %q, want NULL", i, r.headers.String)
			}
		} else {
			var gotH, wantH map[string]any
			if err := json.Unmarshal([]byte(r.headers.String), &gotH); err != nil {
				t.Fatalf("row %d: headers %q: %v", i, r.headers.String, err)
			}
			b, _ := json.Marshal(m.Headers)
			_ = json.Unmarshal(b, &wantH)
			if !reflect.DeepEqual(gotH, wantH) {
				t.Fatalf("row %d: headers %v, want %v", i, gotH, wantH)
			}
		}
		// created_at is UTC, between the start of the test and now.
		if r.createdAt.Before(start.UTC().Truncate(time.Second).Add(-time.Second)) || r.createdAt.After(time.Now().UTC().Add(2*time.Second)) {
			t.Fatalf("row %d: created_at %s not UTC now (%s)", i, r.createdAt, time.Now().UTC())
		}
		if m.AvailableAt.IsZero() != !r.availableAt.Valid ||
			(r.availableAt.Valid && !r.availableAt.Time.Equal(m.AvailableAt.UTC().Truncate(time.Microsecond))) {
			t.Fatalf("row %d: available_at %v, want %v", i, r.availableAt, m.AvailableAt)
		}
	}
}

func TestEnqueueOne(t *testing.T) {
	db := schemaDB(t, migrations.Options{})
	ctx := context.Background()
	start := time.Now()
	msgs := []outbox.Message{testMessage(1)}
	msgs[0].AvailableAt = time.Now().Add(time.Hour).In(time.FixedZone("CET", 3600))

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ex := &countingExecer{Execer: tx}
	ids, err := outbox.Enqueue(ctx, ex, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if ex.execs != 1 {
		t.Fatalf("%d statements, want 1", ex.execs)
	}
	checkReadBack(t, msgs, ids, readRows(t, db, "outbox"), start)
}

func TestEnqueueThousandInOneInsert(t *testing.T) {
	db := schemaDB(t, migrations.Options{})
	ctx := context.Background()
	start := time.Now()
	msgs := make([]outbox.Message, 1000)
	for i := range msgs {
		msgs[i] = testMessage(i)
	}
	msgs[5].Headers = nil
	msgs[6].Payload = nil

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ex := &countingExecer{Execer: tx}
	ids, err := outbox.Enqueue(ctx, ex, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if ex.execs != 1 {
		t.Fatalf("%d statements for 1,000 messages, want 1", ex.execs)
	}
	checkReadBack(t, msgs, ids, readRows(t, db, "outbox"), start)
}

func TestEnqueueSplitsLargeCalls(t *testing.T) {
	db := schemaDB(t, migrations.Options{Table: "big_outbox"})
	ctx := context.Background()
	start := time.Now()
	msgs := make([]outbox.Message, 50)
	for i := range msgs {
		msgs[i] = testMessage(i)
		msgs[i].Payload = bytes.Repeat([]byte{0, byte(i)}, 5000) // 10 kB
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ex := &countingExecer{Execer: tx}
	w := outbox.Writer{Table: "big_outbox", MaxStatementBytes: 64 << 10}
	ids, err := w.Enqueue(ctx, ex, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if ex.execs < 5 {
		t.Fatalf("%d statements for 500 kB with a 64 kB limit", ex.execs)
	}
	checkReadBack(t, msgs, ids, readRows(t, db, "big_outbox"), start)
}

func TestEnqueueConcurrent(t *testing.T) {
	db := schemaDB(t, migrations.Options{})
	ctx := context.Background()
	const goroutines, calls, perCall = 6, 10, 20
	results := make([][]outbox.MessageID, goroutines)
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := 0; c < calls; c++ {
				msgs := make([]outbox.Message, perCall)
				for i := range msgs {
					msgs[i] = testMessage(i)
				}
				ids, err := outbox.Enqueue(ctx, db, msgs...)
				if err != nil {
					t.Error(err)
					return
				}
				results[g] = append(results[g], ids...)
			}
		}()
	}
	wg.Wait()
	seen := map[outbox.MessageID]bool{}
	for g, ids := range results {
		for i, id := range ids {
			checkV7(t, id)
			if i > 0 && bytes.Compare(ids[i-1][:], id[:]) >= 0 {
				t.Fatalf("goroutine %d: ids %d, %d not increasing", g, i-1, i)
			}
			if seen[id] {
				t.Fatalf("duplicate id %s", id)
			}
			seen[id] = true
		}
	}
	if n := countRows(t, db, "outbox"); n != goroutines*calls*perCall {
		t.Fatalf("%d rows", n)
	}
}

func TestEnqueueZeroIsNoop(t *testing.T) {
	ex := &countingExecer{} // nil Execer: any call would panic
	ids, err := outbox.Enqueue(context.Background(), ex)
	if ids != nil || err != nil || ex.execs != 0 {
		t.Fatalf("ids %v, err %v, execs %d", ids, err, ex.execs)
	}
}

func TestEnqueueBadInputWritesNothing(t *testing.T) {
	db := schemaDB(t, migrations.Options{})
	ctx := context.Background()
	cases := []struct {
		name     string
		bad      outbox.Message
		sentinel error
		field    string
	}{
		{"empty routing key", outbox.Message{}, outbox.ErrEmptyRoutingKey, "RoutingKey"},
		{"long routing key", outbox.Message{RoutingKey: strings.Repeat("r", 256)}, outbox.ErrTooLong, "RoutingKey"},
		{"long exchange", outbox.Message{RoutingKey: "r", Exchange: strings.Repeat("e", 256)}, outbox.ErrTooLong, "Exchange"},
		{"long partition key", outbox.Message{RoutingKey: "r", PartitionKey: strings.Repeat("ü", 128)}, outbox.ErrTooLong, "PartitionKey"},
		{"long message type", outbox.Message{RoutingKey: "r", MessageType: strings.Repeat("t", 256)}, outbox.ErrTooLong, "MessageType"},
		{"long content type", outbox.Message{RoutingKey: "r", ContentType: strings.Repeat("c", 101)}, outbox.ErrTooLong, "ContentType"},
		{"invalid UTF-8", outbox.Message{RoutingKey: "r", Exchange: "\xff"}, outbox.ErrInvalidUTF8, "Exchange"},
		{"nested header", outbox.Message{RoutingKey: "r", Headers: map[string]any{"a": map[string]any{}}}, outbox.ErrBadHeaders, `Headers["a"]`},
		{"slice header", outbox.Message{RoutingKey: "r", Headers: map[string]any{"a": []string{"x"}}}, outbox.ErrBadHeaders, `Headers["a"]`},
		{"nil header", outbox.Message{RoutingKey: "r", Headers: map[string]any{"a": nil}}, outbox.ErrBadHeaders, `Headers["a"]`},
		{"reserved header", outbox.Message{RoutingKey: "r", Headers: map[string]any{"x-outbox-id": 1}}, outbox.ErrReservedHeader, `Headers["x-outbox-id"]`},
		{"long header name", outbox.Message{RoutingKey: "r", Headers: map[string]any{strings.Repeat("h", 256): 1}}, outbox.ErrTooLong, `Headers["` + strings.Repeat("h", 256) + `"]`},
		{"available at", outbox.Message{RoutingKey: "r", AvailableAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, outbox.ErrBadAvailableAt, "AvailableAt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The bad message comes second, after a good one: nothing of the
			// call may be written.
			ex := &countingExecer{Execer: db}
			ids, err := outbox.Enqueue(ctx, ex, testMessage(0), c.bad, testMessage(2))
			if !errors.Is(err, c.sentinel) {
				t.Fatalf("err = %v, want %v", err, c.sentinel)
			}
			var ve *outbox.ValidationError
			if !errors.As(err, &ve) || ve.Index != 1 || ve.Field != c.field {
				t.Fatalf("err = %#v, want a *ValidationError for message 1, field %s", err, c.field)
			}
			if ids != nil || ex.execs != 0 {
				t.Fatalf("ids %v, %d statements run", ids, ex.execs)
			}
			if n := countRows(t, db, "outbox"); n != 0 {
				t.Fatalf("%d rows written", n)
			}
		})
	}
	if _, err := (outbox.Writer{Table: "out`box"}).Enqueue(ctx, db, testMessage(0)); err == nil {
		t.Fatal("bad table name accepted")
	}
}

func TestEnqueuePartitioned(t *testing.T) {
	db := schemaDB(t, migrations.Options{Partitioned: true})
	ctx := context.Background()
	start := time.Now()
	msgs := []outbox.Message{testMessage(0), testMessage(1), testMessage(2)}
	ids, err := outbox.Enqueue(ctx, db, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	checkReadBack(t, msgs, ids, readRows(t, db, "outbox"), start)
}
