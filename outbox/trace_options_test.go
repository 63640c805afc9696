package outbox_test

import (
	"testing"

	"go.opentelemetry.io/otel/propagation"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// TestEnqueueTraceContextOptions: NoTracePropagation adds nothing, an
// explicit traceparent is kept, and Propagator replaces the default.
func TestEnqueueTraceContextOptions(t *testing.T) {
	db := schemaDB(t, migrations.Options{})
	ctx, _ := producerSpan(t)
	const explicit = "00-11111111111111111111111111111111-2222222222222222-01"
	if _, err := (outbox.Writer{NoTracePropagation: true}).Enqueue(ctx, db, outbox.Message{RoutingKey: "off"}); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, db, outbox.Message{RoutingKey: "own", Headers: map[string]any{"traceparent": explicit}}); err != nil {
		t.Fatal(err)
	}
	if _, err := (outbox.Writer{Propagator: propagation.TraceContext{}}).Enqueue(ctx, db, outbox.Message{RoutingKey: "tc"}); err != nil {
		t.Fatal(err)
	}
	rows := readRows(t, db, "outbox")
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3", len(rows))
	}
	if rows[0].headers.Valid {
		t.Errorf("NoTracePropagation stored headers %s, want NULL", rows[0].headers.String)
	}
	if h := headersOf(t, rows[1]); h["traceparent"] != explicit {
		t.Errorf("explicit traceparent replaced: headers %v", h)
	}
	if h := headersOf(t, rows[2]); h["traceparent"] == nil || h["baggage"] != nil {
		t.Errorf("Propagator TraceContext only: headers %v, want traceparent and no baggage", h)
	}
}
