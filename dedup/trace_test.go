package dedup_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/dedup"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// handlerSpans records the span context each handler run found in its ctx.
type handlerSpans struct {
	mu sync.Mutex
	by map[string]trace.SpanContext
}

func (h *handlerSpans) handler(runs *calls) dedup.DeliveryHandler {
	return func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error {
		runs.add(d.MessageId)
		h.mu.Lock()
		if h.by == nil {
			h.by = map[string]trace.SpanContext{}
		}
		h.by[d.MessageId] = trace.SpanContextFromContext(ctx)
		h.mu.Unlock()
		return effect(ctx, tx, d.MessageId)
	}
}

func (h *handlerSpans) get(id string) trace.SpanContext {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.by[id]
}

// TestConsumerContinuesTheProducersTrace: the handler of a message whose
// headers carry a producer's W3C trace context runs in a consumer span of
// the producer's trace, child of and linked to the producer's span, with
// the messaging attributes; a malformed traceparent is no failure: the
// message is processed in a new trace.
func TestConsumerContinuesTheProducersTrace(t *testing.T) {
	db := schemaDB(t).SQL
	b := testenv.RabbitMQ(t)
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	pctx, producer := tp.Tracer("producer").Start(context.Background(), "place order")
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(pctx, carrier)
	producer.End()
	ids := newIDs(t, 2)
	traced, malformed := ids[0], ids[1]
	publish(t, b,
		msg{id: traced, typ: "order.placed", key: "order-1", body: `{}`, headers: amqp.Table{"traceparent": carrier["traceparent"]}},
		msg{id: malformed, typ: "order.placed", key: "order-2", body: `{}`, headers: amqp.Table{"traceparent": "00-not-a-trace-01"}})

	var runs calls
	var seen handlerSpans
	c := &dedup.Consumer{
		Inbox: dedup.New(db, "billing"), Queue: b.Queue, TracerProvider: tp,
		Handlers: map[string]dedup.DeliveryHandler{"order.placed": seen.handler(&runs)},
	}
	r := start(t, b.URL, c)
	waitFor(t, 30*time.Second, "both messages processed", func() bool { return c.Stats().Processed == 2 },
		func() string { return statsString(c) + "handler runs " + runs.String() })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}

	psc := producer.SpanContext()
	if got := seen.get(traced); got.TraceID() != psc.TraceID() {
		t.Fatalf("handler of the traced message ran in trace %s, want the producer's %s", got.TraceID(), psc.TraceID())
	}
	if got := seen.get(malformed); !got.IsValid() || got.TraceID() == psc.TraceID() {
		t.Fatalf("handler of the malformed message ran in span context %v, want a new trace", got)
	}
	spans := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range recorder.Ended() {
		spans[s.SpanContext().SpanID()] = s
	}
	cs, ok := spans[seen.get(traced).SpanID()]
	if !ok {
		t.Fatalf("the handler's span %s was not ended; ended: %d spans", seen.get(traced).SpanID(), len(spans))
	}
	if cs.Parent().SpanID() != psc.SpanID() || cs.SpanKind() != trace.SpanKindConsumer || cs.Name() != "process "+b.Queue {
		t.Errorf("consumer span %q kind %v parent %s, want %q, consumer, parent the producer's %s",
			cs.Name(), cs.SpanKind(), cs.Parent().SpanID(), "process "+b.Queue, psc.SpanID())
	}
	if links := cs.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != psc.SpanID() {
		t.Errorf("consumer span links %v, want one to the producer's span", links)
	}
	want := map[attribute.Key]string{
		"messaging.system": "rabbitmq", "messaging.operation.type": "process",
		"messaging.destination.name": b.Exchange, "messaging.message.id": traced,
		"outbox.partition_key": "order-1",
	}
	got := map[attribute.Key]string{}
	for _, kv := range cs.Attributes() {
		got[kv.Key] = kv.Value.Emit()
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("consumer span attribute %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if n := len(effectCounts(t, db)); n != 2 {
		t.Fatalf("%d messages have effects, want 2", n)
	}
}
