package metrics

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
)

func newTestMetrics(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m, reg
}

func gather(t *testing.T, reg prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func labelValues(mf *dto.MetricFamily, label string) []string {
	var vs []string
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				vs = append(vs, lp.GetValue())
			}
		}
	}
	return vs
}

// The public names, types and label values of docs/operations.md exist from the start.
func TestNamesTypesAndLabels(t *testing.T) {
	_, reg := newTestMetrics(t)
	fams := gather(t, reg)
	want := map[string]struct {
		typ    dto.MetricType
		label  string
		values []string
	}{
		"outbox_relay_mode":                              {dto.MetricType_GAUGE, "mode", []string{"binlog", "poll"}},
		"outbox_relay_leader":                            {typ: dto.MetricType_GAUGE},
		"outbox_relay_published_total":                   {typ: dto.MetricType_COUNTER},
		"outbox_relay_publish_failures_total":            {dto.MetricType_COUNTER, "reason", []string{"bad_record", "exchange_not_found", "nacked", "other", "returned", "unroutable"}},
		"outbox_relay_delivery_latency_seconds":          {typ: dto.MetricType_HISTOGRAM},
		"outbox_relay_lag_seconds":                       {typ: dto.MetricType_GAUGE},
		"outbox_relay_inflight_messages":                 {typ: dto.MetricType_GAUGE},
		"outbox_relay_inflight_bytes":                    {typ: dto.MetricType_GAUGE},
		"outbox_relay_pending_rows":                      {typ: dto.MetricType_GAUGE},
		"outbox_relay_reconnects_total":                  {dto.MetricType_COUNTER, "target", []string{"amqp", "binlog", "mysql"}},
		"outbox_relay_failed_messages_total":             {typ: dto.MetricType_COUNTER},
		"outbox_relay_binlog_retention_headroom_seconds": {typ: dto.MetricType_GAUGE},
		"outbox_relay_paused":                            {typ: dto.MetricType_GAUGE},
		"outbox_relay_paused_seconds":                    {typ: dto.MetricType_GAUGE},
	}
	for name, w := range want {
		mf, ok := fams[name]
		if !ok {
			t.Errorf("%s: not gathered", name)
			continue
		}
		if mf.GetType() != w.typ {
			t.Errorf("%s: type %v, want %v", name, mf.GetType(), w.typ)
		}
		if strings.TrimSpace(mf.GetHelp()) == "" {
			t.Errorf("%s: no help text", name)
		}
		if w.label != "" {
			if got := strings.Join(labelValues(mf, w.label), ","); got != strings.Join(w.values, ",") {
				t.Errorf("%s: %s values %q, want %q", name, w.label, got, strings.Join(w.values, ","))
			}
		}
	}
	for name := range fams {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected metric %s", name)
		}
		if !strings.HasPrefix(name, "outbox_relay_") {
			t.Errorf("%s: does not start with outbox_relay_", name)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if probs, err := promlint.NewWithMetricFamilies(mfs).Lint(); err != nil || len(probs) > 0 {
		t.Errorf("promlint: %v %v", probs, err)
	}
}

func TestMetricsMove(t *testing.T) {
	m, _ := newTestMetrics(t)

	clock := time.Unix(1000, 0)
	m.now = func() time.Time { return clock }
	m.SetPaused(true)
	clock = clock.Add(90 * time.Second)
	m.SetPaused(true) // still the same pause: counts from the first call
	if p, s := value(t, m.paused), value(t, m.pausedSeconds); p != 1 || s != 90 {
		t.Errorf("paused %v for %vs, want 1 for 90s", p, s)
	}
	m.SetPaused(false)
	if p, s := value(t, m.paused), value(t, m.pausedSeconds); p != 0 || s != 0 {
		t.Errorf("after resume: paused %v for %vs, want 0 for 0s", p, s)
	}
	m.now = time.Now

	m.SetLeader(true)
	if v := value(t, m.leader); v != 1 {
		t.Errorf("leader %v, want 1", v)
	}
	m.SetLeader(false)
	if v := value(t, m.leader); v != 0 {
		t.Errorf("leader %v, want 0", v)
	}

	m.SetMode(ModePoll)
	if b, p := value(t, m.mode.WithLabelValues("binlog")), value(t, m.mode.WithLabelValues("poll")); b != 0 || p != 1 {
		t.Errorf("mode poll: binlog=%v poll=%v", b, p)
	}
	m.SetMode(ModeBinlog)
	if b, p := value(t, m.mode.WithLabelValues("binlog")), value(t, m.mode.WithLabelValues("poll")); b != 1 || p != 0 {
		t.Errorf("mode binlog: binlog=%v poll=%v", b, p)
	}
	m.SetMode("")
	m.SetMode("bogus")
	if n := count(t, m.mode); n != 2 {
		t.Errorf("mode series %d, want 2 (no label for unknown modes)", n)
	}
	if b, p := value(t, m.mode.WithLabelValues("binlog")), value(t, m.mode.WithLabelValues("poll")); b != 0 || p != 0 {
		t.Errorf("mode none: binlog=%v poll=%v", b, p)
	}

	created := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	m.Delivered(created, created.Add(900*time.Microsecond))
	m.Delivered(created, created.Add(-time.Second)) // skewed clocks: observed as 0
	m.Delivered(time.Time{}, created)               // no created_at: counted, not observed
	if v := value(t, m.published); v != 3 {
		t.Errorf("published %v, want 3", v)
	}
	h := histogram(t, m.deliveryLatency)
	if h.GetSampleCount() != 2 || math.Abs(h.GetSampleSum()-0.0009) > 1e-9 {
		t.Errorf("latency count %d sum %v, want 2 and 0.0009", h.GetSampleCount(), h.GetSampleSum())
	}
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == 0.001 && b.GetCumulativeCount() != 2 {
			t.Errorf("le=0.001 has %d, want 2", b.GetCumulativeCount())
		}
		if b.GetUpperBound() == 0.0005 && b.GetCumulativeCount() != 1 {
			t.Errorf("le=0.0005 has %d, want 1", b.GetCumulativeCount())
		}
	}

	m.PublishFailed(ReasonUnroutable)
	m.PublishFailed(ReturnReason(404))
	m.PublishFailed(ReturnReason(403))
	m.PublishFailed("something new")
	for reason, want := range map[string]float64{"unroutable": 1, "exchange_not_found": 1, "returned": 1, "other": 1, "nacked": 0} {
		if v := value(t, m.publishFailures.WithLabelValues(reason)); v != want {
			t.Errorf("publish failures %s=%v, want %v", reason, v, want)
		}
	}
	if n := count(t, m.publishFailures); n != 6 {
		t.Errorf("publish failure series %d, want 6", n)
	}

	m.MessagesFailed(2)
	m.MessagesFailed(0)
	m.MessagesFailed(-1)
	if v := value(t, m.failedMessages); v != 2 {
		t.Errorf("failed messages %v, want 2", v)
	}

	m.SetInflight(10, 4096)
	m.AddInflight(-3, -1000)
	if v, b := value(t, m.inflightMessages), value(t, m.inflightBytes); v != 7 || b != 3096 {
		t.Errorf("inflight %v msgs %v bytes, want 7 and 3096", v, b)
	}

	m.SetPendingRows(42)
	if v := value(t, m.pendingRows); v != 42 {
		t.Errorf("pending %v", v)
	}

	m.ReconnectedTo(TargetAMQP, "rabbit-1:5672")
	m.ReconnectedTo(TargetAMQP, "rabbit-1:5672")
	m.ReconnectedTo(TargetAMQP, "rabbit-2:5672")
	m.Reconnected(TargetBinlog)
	m.Reconnected("redis")
	if a1, a2, b, s := value(t, m.reconnects.WithLabelValues("amqp", "rabbit-1:5672")), value(t, m.reconnects.WithLabelValues("amqp", "rabbit-2:5672")),
		value(t, m.reconnects.WithLabelValues("binlog", "")),
		value(t, m.reconnects.WithLabelValues("mysql", "")); a1 != 2 || a2 != 1 || b != 1 || s != 0 {
		t.Errorf("reconnects amqp rabbit-1=%v rabbit-2=%v binlog=%v mysql=%v", a1, a2, b, s)
	}
	if n := count(t, m.reconnects); n != 5 { // the three pre-made ones (node "") and the two nodes
		t.Errorf("reconnect series %d, want 5", n)
	}

	if v := value(t, m.retentionHeadroom); !math.IsNaN(v) {
		t.Errorf("headroom before the first computation %v, want NaN", v)
	}
	m.SetRetentionHeadroom(3600)
	if v := value(t, m.retentionHeadroom); v != 3600 {
		t.Errorf("headroom %v", v)
	}
}

// value is the value of the one gauge or counter c collects (what
// prometheus/testutil.ToFloat64 does; testutil itself needs a module this
// repository does not require).
func value(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ms := collect(t, c)
	if len(ms) != 1 {
		t.Fatalf("collected %d metrics, want 1", len(ms))
	}
	switch {
	case ms[0].Gauge != nil:
		return ms[0].GetGauge().GetValue()
	case ms[0].Counter != nil:
		return ms[0].GetCounter().GetValue()
	}
	t.Fatalf("not a gauge or counter: %v", ms[0])
	return 0
}

// count is the number of series c collects.
func count(t *testing.T, c prometheus.Collector) int {
	t.Helper()
	return len(collect(t, c))
}

func collect(t *testing.T, c prometheus.Collector) []*dto.Metric {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var out []*dto.Metric
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		out = append(out, &pb)
	}
	return out
}

func histogram(t *testing.T, c prometheus.Collector) *dto.Histogram {
	t.Helper()
	ms := collect(t, c)
	if len(ms) != 1 || ms[0].Histogram == nil {
		t.Fatalf("want one histogram, got %v", ms)
	}
	return ms[0].GetHistogram()
}

func TestLag(t *testing.T) {
	m, _ := newTestMetrics(t)
	m.SetLag(90.5)
	if v := value(t, m.lag); v != 90.5 {
		t.Errorf("lag %v, want 90.5", v)
	}
	m.SetLag(0) // caught up
	if v := value(t, m.lag); v != 0 {
		t.Errorf("lag caught up %v, want 0", v)
	}
	m.SetLag(-1) // a row dated ahead of the database's clock
	if v := value(t, m.lag); v != 0 {
		t.Errorf("lag of a row dated in the future %v, want 0", v)
	}
}

// The binlog pipeline sets its totals while poll rounds (its first-start
// sweep, its delayed rows) add and take back theirs: neither overwrites the
// other, and the series is their sum.
func TestInflightShares(t *testing.T) {
	m, _ := newTestMetrics(t)
	m.AddInflight(3, 6000) // a round under way
	m.SetInflight(10, 4096)
	m.SetInflight(8, 4000) // the pipeline's next look
	if v, b := value(t, m.inflightMessages), value(t, m.inflightBytes); v != 11 || b != 10000 {
		t.Errorf("in flight %v messages %v bytes, want 11 and 10000", v, b)
	}
	m.AddInflight(-3, 0) // the broker answered the round's messages
	m.SetInflight(0, 0)  // the pipeline ended
	if v, b := value(t, m.inflightMessages), value(t, m.inflightBytes); v != 0 || b != 6000 {
		t.Errorf("in flight %v messages %v bytes, want 0 and 6000 (the round's rows until its commit)", v, b)
	}
	m.AddInflight(0, -6000) // the round committed
	if v, b := value(t, m.inflightMessages), value(t, m.inflightBytes); v != 0 || b != 0 {
		t.Errorf("in flight %v messages %v bytes, want 0 and 0", v, b)
	}
}

// A nil *Metrics is a no-op: the relay calls its methods unconditionally.
func TestNilMetrics(t *testing.T) {
	var m *Metrics
	now := time.Now()
	m.SetMode(ModeBinlog)
	m.SetLeader(true)
	m.Delivered(now, now)
	m.PublishFailed(ReasonNacked)
	m.MessagesFailed(1)
	m.SetLag(1)
	m.SetInflight(1, 1)
	m.AddInflight(1, 1)
	m.SetPendingRows(1)
	m.Reconnected(TargetMySQL)
	m.SetRetentionHeadroom(1)
}

func TestRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg); err == nil || !strings.Contains(err.Error(), "register relay metrics") {
		t.Errorf("second New on one registry: %v, want a registration error", err)
	}
	if m, err := New(nil); err != nil || m == nil {
		t.Errorf("New(nil) = %v, %v; want working unregistered metrics", m, err)
	}

	full, m, err := NewRegistry()
	if err != nil || m == nil {
		t.Fatalf("NewRegistry: %v", err)
	}
	fams := gather(t, full)
	for _, name := range []string{"go_goroutines", "outbox_relay_leader"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("NewRegistry lacks %s", name)
		}
	}
}

func TestLatencyBuckets(t *testing.T) {
	b := LatencyBuckets()
	if b[0] != 0.0005 || b[len(b)-1] != 60 {
		t.Errorf("buckets from %v to %v, want 0.0005 to 60", b[0], b[len(b)-1])
	}
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			t.Fatalf("buckets not increasing at %d: %v", i, b)
		}
	}
	b[0] = 99
	if LatencyBuckets()[0] != 0.0005 {
		t.Error("LatencyBuckets shares its slice")
	}
}
