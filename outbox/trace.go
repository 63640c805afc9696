package outbox

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// DefaultPropagator returns the propagator Enqueue uses unless
// Writer.Propagator is set: W3C Trace Context and W3C Baggage. dedup.Consumer
// uses the same by default.
func DefaultPropagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// withTraceContext returns msgs with the trace context of ctx added to each
// message's Headers, or msgs itself when ctx carries no valid span context
// or tracing is off. The callers' Headers maps are never modified: a message
// that gets fields gets a new map. A header the caller set (say an explicit
// traceparent) is kept as it is.
func (w Writer) withTraceContext(ctx context.Context, msgs []Message) []Message {
	if w.NoTracePropagation || !trace.SpanContextFromContext(ctx).IsValid() {
		return msgs
	}
	p := w.Propagator
	if p == nil {
		p = DefaultPropagator()
	}
	carrier := propagation.MapCarrier{}
	p.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return msgs
	}
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		h := make(map[string]any, len(m.Headers)+len(carrier))
		for k, v := range carrier {
			h[k] = v
		}
		for k, v := range m.Headers {
			h[k] = v // the caller's value wins
		}
		m.Headers = h
		out[i] = m
	}
	return out
}
