package main

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	collectortracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes every export
// request (protobuf) and keeps the spans with their resource's service.name.
type otlpReceiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	requests int
	spans    []*tracepb.Span
	services []string
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		var export collectortracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &export)
		}
		if req.URL.Path != "/v1/traces" || err != nil {
			t.Errorf("OTLP receiver: %s %s: %v", req.Method, req.URL.Path, err)
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.requests++
		for _, rs := range export.ResourceSpans {
			service := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					r.spans = append(r.spans, s)
					r.services = append(r.services, service)
				}
			}
		}
		r.mu.Unlock()
		resp, _ := proto.Marshal(&collectortracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(resp)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// byMessageID returns the received spans by their messaging.message.id,
// with the service name of each.
func (r *otlpReceiver) byMessageID() (map[string]*tracepb.Span, map[string]string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	spans, services := map[string]*tracepb.Span{}, map[string]string{}
	for i, s := range r.spans {
		for _, kv := range s.Attributes {
			if kv.Key == "messaging.message.id" {
				spans[kv.GetValue().GetStringValue()] = s
				services[kv.GetValue().GetStringValue()] = r.services[i]
			}
		}
	}
	return spans, services, r.requests
}

// TestRunTracingExportsOTLP: without --tracing the relay exports nothing;
// with --tracing and OTEL_EXPORTER_OTLP_ENDPOINT it exports one publish
// span per message over OTLP/HTTP, in the producer's trace (parent and
// link: the producer's span), with the enqueue-to-publish delay, as service
// outbox-relay; every message arrives once with its traceparent.
func TestRunTracingExportsOTLP(t *testing.T) {
	ctx := testenv.WorkContext(t)
	db := testenv.MySQL(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	v := consumeAll(t, b)
	recv := startOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.srv.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")

	producer := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	pctx := trace.ContextWithSpanContext(ctx, producer)
	traceparent := "00-" + producer.TraceID().String() + "-" + producer.SpanID().String() + "-01"
	enqueue := func(n int) []outbox.MessageID {
		var ids []outbox.MessageID
		for i := range n {
			m := outbox.Message{PartitionKey: fmt.Sprintf("k%d", i%2), Exchange: b.Exchange, RoutingKey: "orders.placed",
				MessageType: "order.placed", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
			id, err := outbox.Enqueue(pctx, db.SQL, m)
			if err != nil {
				t.Fatal(err)
			}
			v.Expect(validator.Expected{ID: id[0], PartitionKey: m.PartitionKey, Exchange: m.Exchange, RoutingKey: m.RoutingKey,
				MessageType: m.MessageType, Payload: m.Payload, Headers: map[string]any{"traceparent": traceparent}})
			ids = append(ids, id[0])
		}
		return ids
	}

	// Off (the default): the messages go, no span does.
	off := newRelayProc(t, relayArgs(t, db, b)...)
	off.start()
	off.waitLog(ctx, "tailing the binlog")
	enqueue(3)
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if code, _ := off.terminate(30 * time.Second); code != 0 {
		t.Fatalf("relay without --tracing exited %d", code)
	}
	if _, _, n := recv.byMessageID(); n != 0 {
		t.Fatalf("relay without --tracing sent %d OTLP exports, want none", n)
	}

	on := newRelayProc(t, relayArgs(t, db, b, "--tracing")...)
	on.start()
	on.waitLog(ctx, "tailing the binlog")
	ids := enqueue(10)
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	step, cancel := progress.Step(ctx)
	defer cancel()
	for {
		spans, _, _ := recv.byMessageID()
		if len(spans) >= len(ids) {
			break
		}
		select {
		case <-step.Done():
			t.Fatalf("received publish spans of %d of %d messages", len(spans), len(ids))
		case <-time.After(50 * time.Millisecond):
		}
	}
	if code, _ := on.terminate(30 * time.Second); code != 0 {
		t.Fatalf("relay with --tracing exited %d", code)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	spans, services, _ := recv.byMessageID()
	if len(spans) != len(ids) {
		t.Fatalf("publish spans of %d messages, want %d (only the traced relay's)", len(spans), len(ids))
	}
	for _, id := range ids {
		s := spans[id.String()]
		if s == nil {
			t.Fatalf("no publish span of message %s", id)
		}
		if hex.EncodeToString(s.TraceId) != producer.TraceID().String() || hex.EncodeToString(s.ParentSpanId) != producer.SpanID().String() ||
			len(s.Links) != 1 || hex.EncodeToString(s.Links[0].SpanId) != producer.SpanID().String() {
			t.Errorf("message %s: span trace %x parent %x links %v, want trace %s, parent and link %s",
				id, s.TraceId, s.ParentSpanId, s.Links, producer.TraceID(), producer.SpanID())
		}
		if s.Kind != tracepb.Span_SPAN_KIND_PRODUCER || services[id.String()] != "outbox-relay" {
			t.Errorf("message %s: span kind %v of service %q, want producer of outbox-relay", id, s.Kind, services[id.String()])
		}
		var delay bool
		for _, kv := range s.Attributes {
			delay = delay || kv.Key == "outbox.enqueue_to_publish_ms"
		}
		if !delay {
			t.Errorf("message %s: no outbox.enqueue_to_publish_ms attribute: %v", id, s.Attributes)
		}
	}
}
