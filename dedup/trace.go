package dedup

import (
	"context"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// tracerName is the instrumentation scope of the consumer's spans.
const tracerName = "github.com/outbox-relay/outbox-relay/dedup"

// tableCarrier reads an AMQP header table as a propagation carrier. Only
// string values are seen: the W3C headers are strings on the wire.
type tableCarrier amqp.Table

func (c tableCarrier) Get(key string) string {
	s, _ := c[key].(string)
	return s
}

func (c tableCarrier) Set(key, value string) { c[key] = value }

func (c tableCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// startSpan starts the consumer span of d ("process <queue>", kind
// consumer). Its parent is the producer's context found in d's headers
// (traceparent, tracestate, baggage), which is also its link, as the
// messaging semantic conventions ask of a process span; a delivery without
// a valid context (none, or a malformed traceparent) starts a new trace.
// The returned context carries the span and the producer's baggage.
func (c *Consumer) startSpan(ctx context.Context, d amqp.Delivery) (context.Context, trace.Span) {
	return startSpan(ctx, c.TracerProvider, c.Propagator, c.Inbox.consumer, c.Queue, d.Exchange, d)
}

// startSpan starts the span "process <source>" of d for consumer, as
// Consumer.startSpan describes; destination is the span's
// messaging.destination.name, extra are further attributes.
func startSpan(ctx context.Context, tp trace.TracerProvider, p propagation.TextMapPropagator, consumer, source, destination string,
	d amqp.Delivery, extra ...attribute.KeyValue) (context.Context, trace.Span) {
	if p == nil {
		p = outbox.DefaultPropagator()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	ctx = p.Extract(ctx, tableCarrier(d.Headers))
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "rabbitmq"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.destination.name", destination),
		attribute.String("messaging.rabbitmq.destination.routing_key", d.RoutingKey),
		attribute.String("messaging.message.id", d.MessageId),
		attribute.String("messaging.consumer.group.name", consumer),
		attribute.Int("messaging.message.body.size", len(d.Body)),
	}
	if key, _ := d.Headers[headerPartitionKey].(string); key != "" {
		attrs = append(attrs, attribute.String("outbox.partition_key", key))
	}
	if d.Type != "" {
		attrs = append(attrs, attribute.String("outbox.message_type", d.Type))
	}
	attrs = append(attrs, extra...)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	if producer := trace.SpanContextFromContext(ctx); producer.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: producer}))
	}
	return tp.Tracer(tracerName).Start(ctx, "process "+source, opts...)
}

// startSpan starts the consumer span of m ("process <partition stream>",
// kind consumer), a child of and linked to the producer's span as
// Consumer's spans are; its destination is the partition stream, with the
// partition's index and the message's offset.
func (c *StreamConsumer) startSpan(ctx context.Context, m StreamMessage) (context.Context, trace.Span) {
	return startSpan(ctx, c.TracerProvider, c.Propagator, c.Inbox.consumer, m.Stream, m.Stream, m.Delivery,
		attribute.String("messaging.destination.partition.id", strconv.Itoa(m.Partition)),
		attribute.Int64("messaging.rabbitmq.stream.offset", m.Offset))
}

// spanFailed marks the span of ctx failed with err.
func spanFailed(ctx context.Context, err error) {
	span := trace.SpanFromContext(ctx)
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

var _ propagation.TextMapCarrier = tableCarrier(nil)
