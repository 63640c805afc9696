package dedup_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/dedup"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// handlers returns a handler map with one type whose handler records its
// calls and writes one effect.
func handlers(typ string, runs *calls, fail func(id string, call int) error) map[string]dedup.DeliveryHandler {
	return map[string]dedup.DeliveryHandler{
		typ: func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error {
			n := runs.add(d.MessageId)
			if err := effect(ctx, tx, d.MessageId); err != nil {
				return err
			}
			if fail != nil {
				return fail(d.MessageId, n)
			}
			return nil
		},
	}
}

// statsString describes a consumer's counts for failure messages.
func statsString(cs ...*dedup.Consumer) string {
	var b strings.Builder
	for i, c := range cs {
		fmt.Fprintf(&b, "consumer %d: %+v; ", i, c.Stats())
	}
	return b.String()
}

// A crash between the commit and the ack: the first consumer commits the
// handler's work, then its connection is reset before the ack. The broker
// redelivers the message; the second consumer finds it processed, skips the
// handler and acks. The handler ran once.
func TestConsumerCrashBetweenCommitAndAck(t *testing.T) {
	db := schemaDB(t).SQL
	b := testenv.RabbitMQ(t)
	proxy := testenv.Proxy(t, brokerAddr(t, b.URL))
	id := newIDs(t, 1)[0]
	publish(t, b, msg{id: id, typ: "order.placed", key: "order-1", outboxID: 7, body: `{"order":1}`})

	var runs calls
	inbox := dedup.New(db, "billing")
	first := &dedup.Consumer{Inbox: inbox, Queue: b.Queue, Handlers: handlers("order.placed", &runs, nil)}
	dedup.SetAfterCommit(first, func(amqp.Delivery) { proxy.Cut() }) // the process dies here
	r1 := start(t, proxyURL(t, b.URL, proxy.Addr()), first)
	select {
	case err := <-r1.done:
		if err == nil {
			t.Fatal("Run returned nil after its connection was reset")
		}
		close(r1.done)
		t.Logf("first consumer: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatalf("first consumer did not notice its connection reset; %s", statsString(first))
	}

	second := &dedup.Consumer{Inbox: inbox, Queue: b.Queue, Handlers: handlers("order.placed", &runs, nil)}
	var redelivered atomic.Bool
	dedup.SetAfterCommit(second, func(d amqp.Delivery) { redelivered.Store(d.Redelivered) })
	r2 := start(t, b.URL, second)
	waitFor(t, 30*time.Second, "the redelivery skipped", func() bool { return second.Stats().Duplicates == 1 },
		func() string { return statsString(first, second) })
	if err := r2.stop(t); err != nil {
		t.Fatalf("second consumer: %v", err)
	}
	if n := runs.get(id); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if got := effectCounts(t, db)[id]; got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
	if !redelivered.Load() {
		t.Fatal("the second consumer's delivery was not marked redelivered: the first one's ack got through?")
	}
	if s := second.Stats(); s != (dedup.Stats{Duplicates: 1}) {
		t.Fatalf("second consumer %+v, want one duplicate", s)
	}
	if n := queueDepth(t, b.URL, b.Queue); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}
}

// A handler that fails twice and then succeeds: two redeliveries, the
// failed attempts' writes rolled back, one effect, the attempt count
// cleared with the success.
func TestConsumerHandlerFailsTwiceThenSucceeds(t *testing.T) {
	db := schemaDB(t).SQL
	b := testenv.RabbitMQ(t)
	id := newIDs(t, 1)[0]
	publish(t, b, msg{id: id, typ: "order.placed", key: "order-1", body: `{}`})

	var runs calls
	c := &dedup.Consumer{
		Inbox: dedup.New(db, "billing"), Queue: b.Queue, MaxAttempts: 5, RetryDelay: 10 * time.Millisecond,
		Handlers: handlers("order.placed", &runs, func(_ string, call int) error {
			if call <= 2 {
				return fmt.Errorf("payment service down (call %d)", call)
			}
			return nil
		}),
	}
	r := start(t, b.URL, c)
	waitFor(t, 30*time.Second, "the message processed", func() bool { return c.Stats().Processed == 1 },
		func() string { return statsString(c) + "handler runs " + runs.String() })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := runs.get(id); n != 3 {
		t.Fatalf("handler ran %d times, want 3", n)
	}
	if got := effectCounts(t, db)[id]; got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
	if s := c.Stats(); s != (dedup.Stats{Processed: 1, Retried: 2}) {
		t.Fatalf("stats %+v, want 1 processed after 2 retries", s)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM message_inbox_attempts"); n != 0 {
		t.Fatalf("%d attempt rows left after the success, want 0", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM outbox_failed"); n != 0 {
		t.Fatalf("%d failed rows, want 0", n)
	}
	if n := queueDepth(t, b.URL, b.Queue); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}
}

// failedRow is an outbox_failed row as the tests read it.
type failedRow struct {
	OutboxID                                 uint64
	MessageID                                string
	PartitionKey, Exchange, RoutingKey, Type string
	Headers                                  map[string]any
	Payload, ContentType, CreatedAt          string
	Attempts                                 int
	LastError                                sql.NullString
	Error, Source, FailedAt                  string
	AvailableAt, DeliveredAt                 sql.NullString
}

func failedRows(t testing.TB, db *sql.DB) []failedRow {
	t.Helper()
	rows, err := db.Query(`SELECT outbox_id, HEX(message_id), partition_key, exchange, routing_key, message_type,
		COALESCE(headers, 'null'), payload, content_type, created_at, attempts, last_error, error, source, failed_at,
		available_at, delivered_at FROM outbox_failed ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []failedRow
	for rows.Next() {
		var r failedRow
		var hexID, headers string
		if err := rows.Scan(&r.OutboxID, &hexID, &r.PartitionKey, &r.Exchange, &r.RoutingKey, &r.Type, &headers,
			&r.Payload, &r.ContentType, &r.CreatedAt, &r.Attempts, &r.LastError, &r.Error, &r.Source, &r.FailedAt,
			&r.AvailableAt, &r.DeliveredAt); err != nil {
			t.Fatal(err)
		}
		u, err := uuid.Parse(hexID)
		if err != nil {
			t.Fatal(err)
		}
		r.MessageID = u.String()
		if err := json.Unmarshal([]byte(headers), &r.Headers); err != nil {
			t.Fatalf("headers %q: %v", headers, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A poison message (its handler always fails) gets MaxAttempts attempts,
// then lands in outbox_failed with source 'inbox' as the outbox row it came
// from, and is acked; nothing of it is committed.
func TestConsumerPoisonMessageGoesToFailed(t *testing.T) {
	db := schemaDB(t).SQL
	b := testenv.RabbitMQ(t)
	ids := newIDs(t, 2)
	poison, good := ids[0], ids[1]
	createdAt := time.Date(2026, 3, 4, 5, 6, 7, 123456000, time.UTC)
	publish(t, b,
		msg{id: poison, typ: "order.placed", key: "order-9", outboxID: 42, body: `{"order":9}`, createdAt: createdAt,
			headers: amqp.Table{"tenant": "acme", "version": int64(2), "vip": true}},
		msg{id: good, typ: "order.placed", key: "order-10", body: `{"order":10}`})

	const maxAttempts = 3
	var runs calls
	c := &dedup.Consumer{
		Inbox: dedup.New(db, "billing"), Queue: b.Queue, MaxAttempts: maxAttempts, RetryDelay: 10 * time.Millisecond,
		Handlers: handlers("order.placed", &runs, func(id string, call int) error {
			if id == poison {
				return fmt.Errorf("cannot parse order (call %d)", call)
			}
			return nil
		}),
	}
	r := start(t, b.URL, c)
	waitFor(t, 30*time.Second, "the poison message given up and the other processed",
		func() bool { s := c.Stats(); return s.Failed == 1 && s.Processed == 1 },
		func() string { return statsString(c) + "handler runs " + runs.String() })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := runs.get(poison); n != maxAttempts {
		t.Fatalf("poison handler ran %d times, want %d", n, maxAttempts)
	}
	if counts := effectCounts(t, db); counts[poison] != 0 || counts[good] != 1 {
		t.Fatalf("effects %v: want none for the poison message, one for the other", counts)
	}
	if s := c.Stats(); s != (dedup.Stats{Processed: 1, Retried: maxAttempts - 1, Failed: 1}) {
		t.Fatalf("stats %+v", s)
	}
	rows := failedRows(t, db)
	if len(rows) != 1 {
		t.Fatalf("%d failed rows, want 1: %+v", len(rows), rows)
	}
	f := rows[0]
	want := map[string]any{"tenant": "acme", "version": float64(2), "vip": true}
	if f.MessageID != poison || f.OutboxID != 42 || f.PartitionKey != "order-9" || f.Exchange != b.Exchange ||
		f.RoutingKey != "orders.order.placed" || f.Type != "order.placed" || f.Payload != `{"order":9}` ||
		f.ContentType != "application/json" || f.CreatedAt != "2026-03-04 05:06:07.123456" || f.Source != "inbox" ||
		f.Attempts != maxAttempts || f.AvailableAt.Valid || f.DeliveredAt.Valid || fmt.Sprint(f.Headers) != fmt.Sprint(want) {
		t.Fatalf("failed row %+v", f)
	}
	if !f.LastError.Valid || !strings.Contains(f.LastError.String, "cannot parse order (call 3)") ||
		!strings.Contains(f.Error, `consumer "billing": 3 failed attempts, the last: `) || !strings.Contains(f.Error, "cannot parse order (call 3)") {
		t.Fatalf("failed row errors: last_error %q, error %q", f.LastError.String, f.Error)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM message_inbox_attempts"); n != 0 {
		t.Fatalf("%d attempt rows left, want 0", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM message_deduplication WHERE message_id = UNHEX(?)", strings.ReplaceAll(poison, "-", "")); n != 0 {
		t.Fatal("the poison message is recorded as processed: a `failed retry` would be skipped")
	}
	if n := queueDepth(t, b.URL, b.Queue); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}
}

// Messages no attempt can fix go to outbox_failed at once and are acked: a
// type without a handler (when no Unknown handler is set) and a message-id
// that is not a UUID. With Unknown set, unknown types go to it.
func TestConsumerUnknownTypeAndBadID(t *testing.T) {
	db := schemaDB(t).SQL
	b := testenv.RabbitMQ(t)
	ids := newIDs(t, 3)
	publish(t, b,
		msg{id: ids[0], typ: "order.refunded", key: "order-1", body: `{"refund":1}`},
		msg{id: "order-1-placed", typ: "order.placed", key: "order-1", body: `{}`},
		msg{id: ids[1], typ: "order.placed", key: "order-1", body: `{}`})

	var runs calls
	c := &dedup.Consumer{Inbox: dedup.New(db, "billing"), Queue: b.Queue, Handlers: handlers("order.placed", &runs, nil)}
	r := start(t, b.URL, c)
	waitFor(t, 30*time.Second, "all three handled", func() bool { s := c.Stats(); return s.Failed == 2 && s.Processed == 1 },
		func() string { return statsString(c) })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if runs.get(ids[0]) != 0 || runs.get("order-1-placed") != 0 || runs.get(ids[1]) != 1 {
		t.Fatalf("handler runs %s", runs.String())
	}
	rows := failedRows(t, db)
	if len(rows) != 2 {
		t.Fatalf("%d failed rows, want 2: %+v", len(rows), rows)
	}
	byType := map[string]failedRow{rows[0].Type: rows[0], rows[1].Type: rows[1]}
	unknown, badID := byType["order.refunded"], byType["order.placed"]
	if unknown.MessageID != ids[0] || unknown.Error != `no handler for message type "order.refunded"` ||
		unknown.Attempts != 0 || unknown.LastError.Valid || unknown.Source != "inbox" || unknown.Payload != `{"refund":1}` {
		t.Fatalf("unknown type row %+v", unknown)
	}
	if badID.MessageID != "00000000-0000-0000-0000-000000000000" || !strings.Contains(badID.Error, `message-id "order-1-placed" is not a UUID`) || badID.Source != "inbox" {
		t.Fatalf("bad id row %+v", badID)
	}
	if n := queueDepth(t, b.URL, b.Queue); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}

	// With a default handler, an unknown type is processed like any other.
	id := newIDs(t, 1)[0]
	publish(t, b, msg{id: id, typ: "order.shipped", body: `{}`})
	c2 := &dedup.Consumer{Inbox: dedup.New(db, "billing"), Queue: b.Queue, Handlers: handlers("order.placed", &runs, nil),
		Unknown: func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error {
			runs.add(d.Type)
			return effect(ctx, tx, d.MessageId)
		}}
	r2 := start(t, b.URL, c2)
	waitFor(t, 30*time.Second, "the unknown type handled by Unknown", func() bool { return c2.Stats().Processed == 1 },
		func() string { return statsString(c2) })
	if err := r2.stop(t); err != nil {
		t.Fatal(err)
	}
	if runs.get("order.shipped") != 1 || effectCounts(t, db)[id] != 1 || len(failedRows(t, db)) != 2 {
		t.Fatalf("Unknown handler runs %d, effects %d, failed rows %d; want 1, 1, 2",
			runs.get("order.shipped"), effectCounts(t, db)[id], len(failedRows(t, db)))
	}
}

// A duplicate flood: the same 1,000 messages delivered three times each,
// consumed at once by two consumers of one service (two processes, several
// workers each). Every message has exactly one effect, and every delivery
// is acked exactly once.
func TestConsumerDuplicateFlood(t *testing.T) {
	const (
		messages = 1000
		copies   = 3
	)
	db := schemaDB(t).SQL
	b := testenv.RabbitMQ(t)
	ids := newIDs(t, messages)
	var flood []msg
	for i, id := range ids {
		key := ""
		if i%2 == 0 {
			key = fmt.Sprintf("order-%d", i%50) // half the messages ordered by key, half not
		}
		for range copies {
			flood = append(flood, msg{id: id, typ: "order.placed", key: key, outboxID: int64(i + 1), body: `{}`})
		}
	}
	publish(t, b, flood...)

	var runs calls
	inbox := dedup.New(db, "billing")
	c1 := &dedup.Consumer{Inbox: inbox, Queue: b.Queue, Handlers: handlers("order.placed", &runs, nil), Workers: 4, Prefetch: 40}
	c2 := &dedup.Consumer{Inbox: inbox, Queue: b.Queue, Handlers: handlers("order.placed", &runs, nil), Workers: 2, Prefetch: 20}
	r1, r2 := start(t, b.URL, c1), start(t, b.URL, c2)
	acked := func() int64 {
		s1, s2 := c1.Stats(), c2.Stats()
		return s1.Processed + s1.Duplicates + s1.Failed + s2.Processed + s2.Duplicates + s2.Failed
	}
	waitFor(t, 90*time.Second, "every delivery acked", func() bool { return acked() == messages*copies },
		func() string { return statsString(c1, c2) })
	if err := r1.stop(t); err != nil {
		t.Fatal(err)
	}
	if err := r2.stop(t); err != nil {
		t.Fatal(err)
	}
	counts := effectCounts(t, db)
	for _, id := range ids {
		if counts[id] != 1 {
			t.Errorf("message %s: %d effects", id, counts[id])
		}
	}
	s1, s2 := c1.Stats(), c2.Stats()
	processed, dups := s1.Processed+s2.Processed, s1.Duplicates+s2.Duplicates
	if len(counts) != messages || processed != messages || dups != messages*(copies-1) || s1.Failed+s2.Failed != 0 {
		t.Fatalf("%d messages with effects, %d processed, %d duplicates skipped; %s", len(counts), processed, dups, statsString(c1, c2))
	}
	if n := queueDepth(t, b.URL, b.Queue); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}
	t.Logf("%d deliveries: %d effects, %d duplicates skipped (consumer 1 %+v, consumer 2 %+v)",
		messages*copies, processed, dups, s1, s2)
}

// Stop: when the context ends, a handler that is running finishes, commits
// and is acked; the deliveries that had not started go back to the queue
// unprocessed; Run returns nil. A new consumer processes the rest.
func TestConsumerGracefulStop(t *testing.T) {
	db := schemaDB(t).SQL
	b := testenv.RabbitMQ(t)
	ids := newIDs(t, 10)
	var flood []msg
	for _, id := range ids {
		flood = append(flood, msg{id: id, typ: "order.placed", key: "order-1", body: `{}`})
	}
	publish(t, b, flood...)

	var runs calls
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	hs := handlers("order.placed", &runs, nil)
	inner := hs["order.placed"]
	hs["order.placed"] = func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error {
		if err := inner(ctx, tx, d); err != nil {
			return err
		}
		once.Do(func() {
			close(entered)
			<-release // the first handler is in flight when the stop comes
		})
		return ctx.Err() // the handler's context must not end with Run's
	}
	c := &dedup.Consumer{Inbox: dedup.New(db, "billing"), Queue: b.Queue, Handlers: hs, Prefetch: 10}
	r := start(t, b.URL, c)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no handler started")
	}
	waitFor(t, 30*time.Second, "all ten messages delivered to the consumer",
		func() bool { return queueDepth(t, b.URL, b.Queue) == 0 }, func() string { return "" })
	r.cancel()
	// The stop cancels the consumer at the broker while the handler is
	// still running, and Run waits for that handler.
	waitFor(t, 30*time.Second, "the consumer cancelled at the broker",
		func() bool { return inspect(t, b.URL, b.Queue).Consumers == 0 }, func() string { return "" })
	select {
	case err := <-r.done:
		t.Fatalf("Run returned (%v) while a handler was running", err)
	default:
	}
	close(release)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run after stop: %v", err)
	}
	if s := c.Stats(); s != (dedup.Stats{Processed: 1}) {
		t.Fatalf("stats %+v, want the one message in flight processed and nothing else", s)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM effects"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	// The nine that had not started are back in the queue, the processed one is not.
	waitFor(t, 30*time.Second, "nine messages back in the queue", func() bool { return queueDepth(t, b.URL, b.Queue) == 9 },
		func() string { return fmt.Sprintf("%d in the queue", queueDepth(t, b.URL, b.Queue)) })

	c2 := &dedup.Consumer{Inbox: dedup.New(db, "billing"), Queue: b.Queue, Handlers: handlers("order.placed", &runs, nil)}
	r2 := start(t, b.URL, c2)
	waitFor(t, 30*time.Second, "the rest processed", func() bool { return c2.Stats().Processed == 9 },
		func() string { return statsString(c2) })
	if err := r2.stop(t); err != nil {
		t.Fatal(err)
	}
	counts := effectCounts(t, db)
	for _, id := range ids {
		if counts[id] != 1 {
			t.Errorf("message %s: %d effects, want 1", id, counts[id])
		}
	}
}

// Run refuses a configuration it cannot work with, naming the problem.
func TestConsumerRefusesBadConfig(t *testing.T) {
	err := (&dedup.Consumer{Queue: "q"}).Run(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "Inbox") {
		t.Fatalf("no inbox: %v", err)
	}
	err = (&dedup.Consumer{Inbox: dedup.New(nil, "c"), Queue: "q", Workers: -1}).Run(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "negative") {
		t.Fatalf("negative workers: %v", err)
	}
}
