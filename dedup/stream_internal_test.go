package dedup

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	samqp "github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Each process's share of the partitions, rounded up, so every partition
// has a taker; more processes than partitions get one each (the others
// wait for a member slot).
func TestShare(t *testing.T) {
	for _, c := range []struct{ partitions, members, want int }{
		{8, 0, 8}, {8, 1, 8}, {8, 2, 4}, {8, 3, 3}, {8, 4, 2}, {8, 5, 2}, {8, 8, 1}, {8, 9, 1}, {1, 3, 1},
	} {
		if got := share(c.partitions, c.members); got != c.want {
			t.Errorf("share(%d, %d) = %d, want %d", c.partitions, c.members, got, c.want)
		}
		// The shares cover every partition.
		if m := max(c.members, 1); share(c.partitions, m)*m < c.partitions {
			t.Errorf("share(%d, %d) leaves partitions without a taker", c.partitions, c.members)
		}
	}
}

// Lock names fit MySQL's 64 characters, keep apart from the relay's
// "outbox-relay:" locks, differ per consumer, partition and slot, and do not
// confuse a name made of two parts with another split of the same bytes.
func TestStreamLockNames(t *testing.T) {
	seen := map[string]string{}
	add := func(what, name string) {
		t.Helper()
		if len(name) > 64 || strings.HasPrefix(name, "outbox-relay:") {
			t.Errorf("%s: lock name %q: longer than 64 or in the relay's namespace", what, name)
		}
		if prev, ok := seen[name]; ok {
			t.Errorf("%s and %s share the lock name %q", what, prev, name)
		}
		seen[name] = what
	}
	long := strings.Repeat("ü", 255)
	for _, consumer := range []string{"billing", "billing-a", "", long} {
		for i := 0; i < 3; i++ {
			add(consumer+" partition "+PartitionStream("orders", i), StreamLockName(consumer, PartitionStream("orders", i)))
			add(consumer+" slot "+PartitionStream("orders", i), streamMemberLockName(consumer, "orders", i))
		}
	}
	if StreamLockName("a-b", "c") == StreamLockName("a", "b-c") {
		t.Error("consumer and stream are not kept apart in the lock name")
	}
	if got := StreamLockName("billing", "orders-0"); got != StreamLockName("billing", "orders-0") {
		t.Errorf("lock name not stable: %s", got)
	}
}

func TestPartitionStream(t *testing.T) {
	if got := PartitionStream("orders", 7); got != "orders-7" {
		t.Fatalf("PartitionStream = %q", got)
	}
}

// A stream message in the relay's format (docs/wire.md) reads back as the
// AMQP delivery it stands for.
func TestStreamDelivery(t *testing.T) {
	at := time.Date(2026, 11, 27, 10, 0, 0, 123_000_000, time.UTC)
	m := &samqp.Message{Data: [][]byte{[]byte("bo"), []byte("dy")}}
	m.Properties = &samqp.MessageProperties{MessageID: "0190f1c2-3b4d-7e5f-8a9b-0c1d2e3f4a5b",
		Subject: "order.placed", ContentType: "application/json", CreationTime: at}
	m.ApplicationProperties = map[string]any{"x-exchange": "ex", "x-routing-key": "rk",
		"x-partition-key": "k1", "x-outbox-id": int64(42), "tenant": "acme"}
	d := StreamDelivery(m)
	if d.MessageId != "0190f1c2-3b4d-7e5f-8a9b-0c1d2e3f4a5b" || d.Type != "order.placed" || d.ContentType != "application/json" ||
		!d.Timestamp.Equal(at) || d.Exchange != "ex" || d.RoutingKey != "rk" || string(d.Body) != "body" {
		t.Fatalf("delivery %+v", d)
	}
	if d.Headers["x-partition-key"] != "k1" || d.Headers["x-outbox-id"] != int64(42) || d.Headers["tenant"] != "acme" {
		t.Fatalf("headers %v", d.Headers)
	}
	if _, ok := d.Headers["x-exchange"]; ok {
		t.Fatalf("x-exchange left in the headers: %v", d.Headers)
	}
	if d := StreamDelivery(&samqp.Message{}); d.MessageId != "" || len(d.Headers) != 0 {
		t.Fatalf("empty message: %+v", d)
	}
}

// Messages no attempt can fix get no handler and a reason; the others
// their type's handler, else Unknown.
func TestStreamHandlerFor(t *testing.T) {
	h := func(context.Context, *sql.Tx, StreamMessage) error { return nil }
	c := &StreamConsumer{Handlers: map[string]StreamHandler{"a": h}}
	msg := func(id, typ string) StreamMessage {
		var m StreamMessage
		m.Delivery.MessageId, m.Delivery.Type = id, typ
		return m
	}
	const id = "0190f1c2-3b4d-7e5f-8a9b-0c1d2e3f4a5b"
	if got, _ := c.handlerFor(msg(id, "a")); got == nil {
		t.Error("no handler for a known type")
	}
	if got, why := c.handlerFor(msg(id, "b")); got != nil || !strings.Contains(why, `no handler for message type "b"`) {
		t.Errorf("unknown type: handler %v, %q", got != nil, why)
	}
	if got, why := c.handlerFor(msg("m-1", "a")); got != nil || !strings.Contains(why, "not a UUID") {
		t.Errorf("bad id: handler %v, %q", got != nil, why)
	}
	c.Unknown = h
	if got, _ := c.handlerFor(msg(id, "b")); got == nil {
		t.Error("Unknown not used")
	}
}

func TestStreamConsumerCheck(t *testing.T) {
	in := New(nil, "c")
	for _, c := range []*StreamConsumer{
		{}, {Inbox: in}, {Inbox: in, Stream: "s"}, {Inbox: in, Stream: "s", Partitions: 2, Credits: -1},
		{Inbox: in, Stream: "s", Partitions: 2, MaxAttempts: -1}, {Inbox: New(nil, "x\xff"), Stream: "s", Partitions: 1},
	} {
		if err := c.check(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := (&StreamConsumer{Inbox: in, Stream: "s", Partitions: 8}).check(); err != nil {
		t.Error(err)
	}
}

// A stream message's span continues the producer's trace (traceparent in
// the application properties), names the partition stream, and carries
// the partition and the offset.
func TestStreamSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	c := &StreamConsumer{Inbox: New(nil, "billing"), TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))}
	m := StreamMessage{Stream: "orders-3", Partition: 3, Offset: 77}
	m.Delivery.MessageId = "0190f1c2-3b4d-7e5f-8a9b-0c1d2e3f4a5b"
	m.Delivery.Headers = amqp.Table{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-partition-key": "k"}
	_, span := c.startSpan(context.Background(), m)
	span.End()
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	s := spans[0]
	if s.Name() != "process orders-3" || s.SpanKind() != trace.SpanKindConsumer ||
		s.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || len(s.Links()) != 1 {
		t.Fatalf("span %s kind %v parent %v links %d", s.Name(), s.SpanKind(), s.Parent().TraceID(), len(s.Links()))
	}
	want := map[attribute.Key]string{"messaging.destination.name": "orders-3", "messaging.destination.partition.id": "3",
		"messaging.rabbitmq.stream.offset": "77", "messaging.consumer.group.name": "billing", "outbox.partition_key": "k"}
	for _, kv := range s.Attributes() {
		if w, ok := want[kv.Key]; ok {
			if kv.Value.Emit() != w {
				t.Errorf("%s = %s, want %s", kv.Key, kv.Value.Emit(), w)
			}
			delete(want, kv.Key)
		}
	}
	if len(want) != 0 {
		t.Errorf("attributes missing: %v", want)
	}
}
