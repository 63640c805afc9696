package relay

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// 20,000 messages over 200 partitions from 8 concurrent producers, mixing
// one-row and 500-row transactions: each arrives once, in commit order per
// partition, with body, headers and properties equal to its row; then the
// outbox is empty and the checkpoint is stored.
func TestRelayDeliversEveryMessageOnceInOrder(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	v := consume(t, b, b.Queue)
	stop := startRelay(t, db, b, nil)
	ctx := testenv.WorkContext(t)

	produce(ctx, t, db, b, v, load{producers: 8, partitions: 200, total: 8_000, bigTxn: 500, bigShare: 0.5})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	if err := stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	var gtid string
	if err := db.SQL.QueryRowContext(ctx, "SELECT gtid_set FROM outbox_relay_progress WHERE relay_name = ?", relayNameFor(db.Name)).Scan(&gtid); err != nil || gtid == "" {
		t.Fatalf("stored position %q, %v: want a GTID set", gtid, err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox_failed", 0)
}

// The same in --on-delivered=mark mode: rows stay, marked delivered.
func TestRelayMarkMode(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	v := consume(t, b, b.Queue)
	startRelay(t, db, b, func(c *Config) { c.OnDelivered = "mark" })
	ctx := testenv.WorkContext(t)

	produce(ctx, t, db, b, v, load{producers: 4, partitions: 20, total: 2_000, bigTxn: 100, bigShare: 0.5})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL", 2_000)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
}

// Unroutable messages and messages to a missing exchange land in
// outbox_failed; the messages after them in the same partition still arrive,
// in order.
func TestRelayUnroutableGoesToFailedAndPartitionMovesOn(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	ctx := testenv.WorkContext(t)
	unbound := b.Exchange + ".unbound"
	declareExchange(t, b.URL, unbound)
	v := consume(t, b, b.Queue)
	startRelay(t, db, b, nil)

	msgs := []outbox.Message{
		{PartitionKey: "order-1", RoutingKey: "a", Payload: []byte(`{"n":1}`)},
		{PartitionKey: "order-1", Exchange: unbound, RoutingKey: "nowhere", Payload: []byte(`{"n":2}`)},
		{PartitionKey: "order-1", RoutingKey: "b", Payload: []byte(`{"n":3}`)},
		{PartitionKey: "order-1", Exchange: b.Exchange + ".missing", RoutingKey: "x", Payload: []byte(`{"n":4}`)},
		{PartitionKey: "order-1", RoutingKey: "c", Payload: []byte(`{"n":5}`)},
	}
	ids, err := outbox.Enqueue(ctx, db.SQL, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 2, 4} {
		v.Expect(validator.Expected{ID: ids[i], PartitionKey: "order-1", Exchange: b.Exchange,
			RoutingKey: msgs[i].RoutingKey, Payload: msgs[i].Payload})
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox_failed WHERE source = 'relay'", 2)
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	// A missing exchange is found by the publisher's check before anything
	// is sent to it, so bad input costs its neighbours nothing: exactly once.
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	rows, err := db.SQL.QueryContext(ctx, "SELECT message_id, payload, error FROM outbox_failed ORDER BY outbox_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var id, payload []byte
		var reason string
		if err := rows.Scan(&id, &payload, &reason); err != nil {
			t.Fatal(err)
		}
		if reason == "" {
			t.Errorf("failed row %s has no error text", payload)
		}
		got = append(got, string(payload))
		t.Logf("outbox_failed: %s: %s", payload, reason)
	}
	if len(got) != 2 || got[0] != `{"n":2}` || got[1] != `{"n":4}` {
		t.Fatalf("outbox_failed holds %q, want the unroutable and the missing-exchange message", got)
	}
}

func declareExchange(t *testing.T, url, name string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, "topic", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := amqp.Dial(url); err == nil {
			if ch, err := c.Channel(); err == nil {
				_ = ch.ExchangeDelete(name, false, false)
			}
			c.Close()
		}
	})
}

var _ = testenv.Require

// Delayed rows in binlog mode: the stream leaves them to the due-time sweep,
// which delivers each once it is due and never before; rows without a delay
// go out from the stream, not held back by them.
func TestRelayDeliversDelayedRowsWhenDue(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	v := consume(t, b, b.Queue)
	startRelay(t, db, b, nil)
	ctx := testenv.Context(t, time.Minute)

	due := time.Now().Add(2 * time.Second)
	msgs := []outbox.Message{
		{PartitionKey: "order-9", RoutingKey: "a", Payload: []byte(`{"n":1}`)},
		{RoutingKey: "b", Payload: []byte(`{"n":2}`), AvailableAt: due},
		{PartitionKey: "order-9", RoutingKey: "c", Payload: []byte(`{"n":3}`)},
		{RoutingKey: "d", Payload: []byte(`{"n":4}`), AvailableAt: time.Now().Add(-time.Hour)},
	}
	ids, err := outbox.Enqueue(ctx, db.SQL, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		v.Expect(validator.Expected{ID: ids[i], PartitionKey: m.PartitionKey, Exchange: b.Exchange,
			RoutingKey: m.RoutingKey, Payload: m.Payload})
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	// Everything has arrived by now, so if now is before b's time, b
	// came early.
	if time.Now().Before(due) {
		t.Fatal("a delayed message was delivered before its available_at")
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
}
