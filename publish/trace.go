package publish

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the relay's publish spans.
const TracerName = "github.com/outbox-relay/outbox-relay/publish"

// AttrEnqueueToPublish is the publish span's attribute holding the time in
// milliseconds from the row's created_at (its INSERT, inside the producer's
// transaction, so at or before the commit) to the publish.
const AttrEnqueueToPublish = "outbox.enqueue_to_publish_ms"

// headerCarrier reads an AMQP header table as a propagation carrier; only
// string values are seen (the W3C headers are strings).
type headerCarrier amqp.Table

func (c headerCarrier) Get(key string) string {
	s, _ := c[key].(string)
	return s
}

func (c headerCarrier) Set(string, string) {} // read only: the relay never changes a message's trace headers

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// startSpan starts m's publish span ("publish <exchange>", kind producer).
// The producer's context found in m's W3C headers (traceparent,
// tracestate) is its parent and its link, so the span sits in the
// producer's trace and follows its sampling decision; a message without a
// valid context gets a span of its own trace. The message's headers are
// not changed: the consumer's span continues the producer's span, not this
// one.
func (c *Channel) startSpan(m *Message) trace.Span {
	ctx := propagation.TraceContext{}.Extract(c.ctx, headerCarrier(m.Publishing.Headers))
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "rabbitmq"),
		attribute.String("messaging.operation.name", "publish"),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.destination.name", m.Exchange),
		attribute.String("messaging.rabbitmq.destination.routing_key", m.RoutingKey),
		attribute.String("messaging.message.id", m.Publishing.MessageId),
		attribute.Int("messaging.message.body.size", len(m.Publishing.Body)),
	}
	if m.Key != "" {
		attrs = append(attrs, attribute.String("outbox.partition_key", m.Key))
	}
	if id, ok := m.Publishing.Headers[HeaderOutboxID].(int64); ok {
		attrs = append(attrs, attribute.Int64("outbox.id", id))
	}
	if at := m.Publishing.Timestamp; !at.IsZero() {
		attrs = append(attrs, attribute.Float64(AttrEnqueueToPublish, float64(time.Since(at).Microseconds())/1000))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...)}
	if producer := trace.SpanContextFromContext(ctx); producer.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: producer}))
	}
	_, span := c.tracer.Start(ctx, "publish "+m.Exchange, opts...)
	return span
}

// endSpan ends a publish span with the message's outcome.
func endSpan(span trace.Span, res Result) {
	span.SetAttributes(attribute.String("outbox.outcome", res.Outcome.String()))
	if res.Outcome != Confirmed {
		span.SetStatus(codes.Error, res.Reason)
	}
	span.End()
}
