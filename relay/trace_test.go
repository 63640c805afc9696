package relay

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/dedup"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
)

// TestRelayCarriesTheTrace: messages enqueued under a producer span reach a
// dedup.Consumer whose handler runs in the producer's trace, through the
// real relay and broker; the relay's own publish span per message is in that
// trace too, with the enqueue-to-publish delay. A row whose traceparent is
// malformed is published with it as it is, and its handler runs in a new
// trace. Every message arrives once, in order per key, headers intact.
func TestRelayCarriesTheTrace(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	v := consume(t, b, b.Queue)
	inboxQueue := b.DeclareQueue(t, "#")
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	stop := startRelay(t, db, b, func(c *Config) { c.Tracer = tp.Tracer(publish.TracerName) })
	ctx := testenv.WorkContext(t)

	// The producer: one request span, one transaction of 20 messages over
	// 4 keys, then one row with a malformed traceparent written without a
	// span.
	pctx, producer := tp.Tracer("producer").Start(ctx, "place orders")
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(pctx, carrier)
	var msgs []outbox.Message
	for i := range 20 {
		msgs = append(msgs, outbox.Message{
			PartitionKey: fmt.Sprintf("order-%d", i%4), Exchange: b.Exchange, RoutingKey: "orders.placed",
			MessageType: "order.placed", Payload: fmt.Appendf(nil, `{"n":%d}`, i),
		})
	}
	const malformedParent = "00-not-a-trace-id-01"
	ids := enqueueExpected(pctx, t, db.SQL, v, msgs, map[string]any{"traceparent": carrier["traceparent"]})
	producer.End()
	bad := enqueueExpected(ctx, t, db.SQL, v, []outbox.Message{{
		PartitionKey: "order-x", Exchange: b.Exchange, RoutingKey: "orders.placed", MessageType: "order.placed",
		Payload: []byte(`{}`), Headers: map[string]any{"traceparent": malformedParent},
	}}, nil)[0]

	var handlerSpans sync.Map // message id text → trace.SpanContext
	c := &dedup.Consumer{
		Inbox: dedup.New(db.SQL, "trace-test"), Queue: inboxQueue, TracerProvider: tp,
		Unknown: func(ctx context.Context, _ *sql.Tx, d amqp.Delivery) error {
			handlerSpans.Store(d.MessageId, trace.SpanContextFromContext(ctx))
			return nil
		},
	}
	runConsumer(ctx, t, b.URL, c)
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pollWhile(ctx, func() float64 { return float64(c.Stats().Processed) }, func() bool {
		return c.Stats().Processed >= int64(len(ids)+1)
	}); err != nil {
		t.Fatalf("inbox consumer processed %+v of %d messages: %v", c.Stats(), len(ids)+1, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}

	psc := producer.SpanContext()
	publishSpans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range recorder.Ended() {
		if s.SpanKind() == trace.SpanKindProducer {
			for _, kv := range s.Attributes() {
				if kv.Key == "messaging.message.id" {
					publishSpans[kv.Value.AsString()] = s
				}
			}
		}
	}
	for _, id := range ids {
		sc, _ := handlerSpans.Load(id.String())
		if got, _ := sc.(trace.SpanContext); got.TraceID() != psc.TraceID() {
			t.Errorf("message %s: handler ran in trace %s, want the producer's %s", id, got.TraceID(), psc.TraceID())
		}
		ps, ok := publishSpans[id.String()]
		if !ok {
			t.Errorf("message %s: no publish span of the relay", id)
			continue
		}
		if ps.Parent().SpanID() != psc.SpanID() || ps.SpanContext().TraceID() != psc.TraceID() ||
			len(ps.Links()) != 1 || ps.Links()[0].SpanContext.SpanID() != psc.SpanID() {
			t.Errorf("message %s: publish span in trace %s, parent %s, links %v; want the producer's trace %s, parent and link %s",
				id, ps.SpanContext().TraceID(), ps.Parent().SpanID(), ps.Links(), psc.TraceID(), psc.SpanID())
		}
		if !hasAttr(ps, publish.AttrEnqueueToPublish) {
			t.Errorf("message %s: publish span lacks %s: %v", id, publish.AttrEnqueueToPublish, ps.Attributes())
		}
	}
	if len(publishSpans) != len(ids)+1 {
		t.Errorf("%d publish spans, want one per message (%d)", len(publishSpans), len(ids)+1)
	}
	sc, _ := handlerSpans.Load(bad.String())
	if got, _ := sc.(trace.SpanContext); !got.IsValid() || got.TraceID() == psc.TraceID() {
		t.Errorf("malformed traceparent: handler ran in span context %v, want a valid new trace", got)
	}
}

// enqueueExpected enqueues msgs in one transaction under ctx and registers
// them with v; traceHeaders are the headers Enqueue adds from ctx.
func enqueueExpected(ctx context.Context, t *testing.T, db *sql.DB, v *validator.Validator, msgs []outbox.Message, traceHeaders map[string]any) []outbox.MessageID {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := outbox.Enqueue(ctx, tx, msgs...)
	if err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		h := map[string]any{}
		for k, v := range traceHeaders {
			h[k] = v
		}
		for k, v := range m.Headers {
			h[k] = v
		}
		v.Expect(validator.Expected{
			ID: ids[i], PartitionKey: m.PartitionKey, Exchange: m.Exchange, RoutingKey: m.RoutingKey,
			MessageType: m.MessageType, Payload: m.Payload, Headers: h,
		})
	}
	return ids
}

// runConsumer runs c on its own connection until the test ends.
func runConsumer(ctx context.Context, t *testing.T, url string, c *dedup.Consumer) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, ch) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("inbox consumer: %v", err)
		}
		conn.Close()
	})
}

func hasAttr(s sdktrace.ReadOnlySpan, key string) bool {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return true
		}
	}
	return false
}
