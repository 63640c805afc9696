package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// producerSpan returns ctx carrying a sampled remote span context with a
// tracestate and a baggage member, as an instrumented request handler has.
func producerSpan(t *testing.T) (context.Context, trace.SpanContext) {
	t.Helper()
	ts, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
		TraceState: ts,
	})
	m, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	b, err := baggage.New(m)
	if err != nil {
		t.Fatal(err)
	}
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	return baggage.ContextWithBaggage(ctx, b), sc
}

func headersOf(t *testing.T, r row) map[string]any {
	t.Helper()
	if !r.headers.Valid {
		return nil
	}
	var h map[string]any
	if err := json.Unmarshal([]byte(r.headers.String), &h); err != nil {
		t.Fatalf("headers %q: %v", r.headers.String, err)
	}
	return h
}

// TestEnqueueCarriesTraceContext: the W3C trace context of Enqueue's ctx is
// stored in every message's headers next to the caller's own, and a ctx
// without a span adds nothing.
func TestEnqueueCarriesTraceContext(t *testing.T) {
	db := schemaDB(t, migrations.Options{})
	ctx, sc := producerSpan(t)
	own := map[string]any{"tenant": "x"}
	if _, err := outbox.Enqueue(ctx, db,
		outbox.Message{RoutingKey: "a", Headers: own},
		outbox.Message{RoutingKey: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(context.Background(), db, outbox.Message{RoutingKey: "c"}); err != nil {
		t.Fatal(err)
	}
	rows := readRows(t, db, "outbox")
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3", len(rows))
	}
	wantParent := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	for i, r := range rows[:2] {
		h := headersOf(t, r)
		if h["traceparent"] != wantParent || h["tracestate"] != "vendor=abc" || h["baggage"] != "tenant=acme" {
			t.Errorf("row %d headers %v: want traceparent %q, tracestate vendor=abc, baggage tenant=acme", i, h, wantParent)
		}
	}
	if h := headersOf(t, rows[0]); h["tenant"] != "x" || len(h) != 4 {
		t.Errorf("row 0 headers %v: want the caller's tenant=x and the three trace headers", h)
	}
	if len(own) != 1 {
		t.Errorf("the caller's Headers map was modified: %v", own)
	}
	if rows[2].headers.Valid {
		t.Errorf("a ctx without a span stored headers %s, want NULL", rows[2].headers.String)
	}
}
