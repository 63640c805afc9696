package metrics_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/metrics"
)

// serve starts ServeListener on a free loopback port and returns its base
// URL; the server is stopped (and its return checked) at cleanup.
func serve(t *testing.T, reg prometheus.Gatherer, ready func() error) string {
	t.Helper()
	ln, err := metrics.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- metrics.ServeListener(ctx, ln, reg, ready, zap.NewNop()) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("ServeListener after cancel: %v, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("ServeListener did not return after cancel")
		}
	})
	return "http://" + ln.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	var notReady atomic.Pointer[error]
	starting := errors.New("no leadership yet")
	notReady.Store(&starting)
	ready := func() error {
		if p := notReady.Load(); p != nil {
			return *p
		}
		return nil
	}
	base := serve(t, reg, ready)

	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q, want 200 \"ok\\n\"", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "no leadership yet") {
		t.Errorf("/readyz not ready = %d %q, want 503 naming the reason", code, body)
	}
	notReady.Store(nil)
	if code, body := get(t, base+"/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz ready = %d %q, want 200", code, body)
	}
	// A ReadyNote is ready, with the note (the broker node in use).
	var note error = metrics.ReadyNote("publishing to RabbitMQ node 10.0.0.2:5672")
	notReady.Store(&note)
	if code, body := get(t, base+"/readyz"); code != 200 || body != "ready: publishing to RabbitMQ node 10.0.0.2:5672\n" {
		t.Errorf("/readyz ready with a note = %d %q, want 200 with the note", code, body)
	}
	notReady.Store(nil)
	// /healthz does not depend on readiness.
	notReady.Store(&starting)
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz while not ready = %d, want 200", code)
	}

	m.SetLeader(true)
	m.Reconnected(metrics.TargetAMQP)
	code, body := get(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		"outbox_relay_leader 1",
		`outbox_relay_reconnects_total{node="",target="amqp"} 1`,
		`outbox_relay_mode{mode="binlog"} 0`,
		`outbox_relay_delivery_latency_seconds_bucket{le="0.0005"} 0`,
		"outbox_relay_binlog_retention_headroom_seconds NaN",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	if code, _ := get(t, base+"/nope"); code != 404 {
		t.Errorf("/nope = %d, want 404", code)
	}
	resp, err := http.Post(base+"/healthz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz = %d, want 405", resp.StatusCode)
	}
}

func TestNilReadyIsReady(t *testing.T) {
	base := serve(t, prometheus.NewRegistry(), nil)
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz with a nil ready func = %d, want 200", code)
	}
}

// A busy address fails at Listen (and Serve) with an error naming it.
func TestBindError(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()

	_, err = metrics.Listen(addr)
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("Listen on a busy address: %v; want an error naming %s and the cause", err, addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = metrics.Serve(ctx, addr, prometheus.NewRegistry(), nil, nil)
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("Serve on a busy address: %v; want an error naming %s", err, addr)
	}
	if ctx.Err() != nil {
		t.Error("Serve waited for the context instead of failing at once")
	}

	if _, err := metrics.Listen("127.0.0.1:notaport"); err == nil || !strings.Contains(err.Error(), "127.0.0.1:notaport") {
		t.Errorf("Listen on a bad address: %v", err)
	}
}

// A listener that fails while serving ends ServeListener with an error.
func TestServeListenerFails(t *testing.T) {
	ln, err := metrics.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- metrics.ServeListener(context.Background(), failingListener{ln}, prometheus.NewRegistry(), nil, nil)
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "accept broke") {
			t.Errorf("ServeListener with a failing listener: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeListener did not return when its listener failed")
	}
}

type failingListener struct{ net.Listener }

func (l failingListener) Accept() (net.Conn, error) {
	l.Listener.Close()
	return nil, errors.New("accept broke")
}
