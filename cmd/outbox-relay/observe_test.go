package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

var metricsAddrRE = regexp.MustCompile(`serving /metrics, /healthz and /readyz.*"addr": "([^"]+)"`)

// metricsURL is the base URL the relay's current start serves HTTP on.
func (p *relayProc) metricsURL(ctx context.Context) string {
	p.t.Helper()
	p.waitLog(ctx, "serving /metrics")
	m := metricsAddrRE.FindAllStringSubmatch(p.output(), -1)
	if len(m) == 0 {
		p.t.Fatalf("no metrics address in the relay's log")
	}
	return "http://" + m[len(m)-1][1]
}

func httpGet(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metricValue reads one sample (name with its labels, exactly as exposed)
// from a /metrics scrape; 0 when absent.
func metricValue(t *testing.T, base, sample string) float64 {
	t.Helper()
	code, body, err := httpGet(base + "/metrics")
	if err != nil || code != 200 {
		t.Fatalf("scrape /metrics: %d %v", code, err)
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", sample, err)
			}
			return v
		}
	}
	return 0
}

// waitMetric waits until sample reaches want, and fails if it passes it.
func waitMetric(ctx context.Context, t *testing.T, base, sample string, want float64) {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	for {
		got := metricValue(t, base, sample)
		if got > want {
			t.Fatalf("%s = %v, more than the %v expected", sample, got, want)
		}
		if got == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s = %v, never reached %v", sample, got, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// During a run, /metrics shows the published counter and the latency
// histogram moving by exactly the number of messages delivered; /healthz
// and /readyz answer 200 and the mode and leader gauges are set.
func TestRunMetricsMoveWithPublishing(t *testing.T) {
	for _, mode := range []string{"binlog", "poll"} {
		t.Run(mode, func(t *testing.T) { testMetricsMove(t, mode) })
	}
}

func testMetricsMove(t *testing.T, mode string) {
	db := testenv.MySQL(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	ctx := testenv.WorkContext(t)
	v := consumeAll(t, b)
	p := newRelayProc(t, relayArgs(t, db, b, "--mode", mode)...)
	p.start()
	if mode == "binlog" {
		// The message itself: "delivered pending rows before tailing the
		// binlog" comes first, before the relay is ready.
		p.waitLog(ctx, "\ttailing the binlog\t")
	} else {
		p.waitLog(ctx, "polling the outbox table")
	}
	base := p.metricsURL(ctx)

	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body, err := httpGet(base + path); err != nil || code != 200 {
			t.Fatalf("GET %s: %d %q %v", path, code, body, err)
		}
	}
	if got := metricValue(t, base, "outbox_relay_leader"); got != 1 {
		t.Fatalf("outbox_relay_leader = %v, want 1", got)
	}
	if got := metricValue(t, base, `outbox_relay_mode{mode="`+mode+`"}`); got != 1 {
		t.Fatalf(`outbox_relay_mode{mode=%q} = %v, want 1`, mode, got)
	}
	before := metricValue(t, base, "outbox_relay_published_total")
	latBefore := metricValue(t, base, "outbox_relay_delivery_latency_seconds_count")

	const n = 1_000
	testload.Produce(ctx, t, db.SQL, v, testload.Load{Producers: 4, Partitions: 20, Total: n, BigTxn: 100, BigShare: 0.5, Exchange: b.Exchange})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	// A consumer can have a message before the relay has its confirm: wait
	// for the counters to catch up, then they must match exactly.
	waitMetric(ctx, t, base, "outbox_relay_published_total", before+n)
	waitMetric(ctx, t, base, "outbox_relay_delivery_latency_seconds_count", latBefore+n)
	if code, _ := p.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM: exit code %d", code)
	}
}

// /readyz turns 503 when the database goes away and 200 again when it is back.
func TestRunReadyzFollowsTheDatabase(t *testing.T) {
	t.Parallel() // a server of its own
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	ctx := testenv.WorkContext(t)
	p := newRelayProc(t, relayArgs(t, db, b, "--heartbeat-interval", "500ms")...)
	p.start()
	p.waitLog(ctx, "tailing the binlog")
	base := p.metricsURL(ctx)

	waitStatus := func(want int) {
		t.Helper()
		var (
			code int
			body string
			err  error
		)
		if werr := progress.Wait(ctx, "/readyz", nil, func() bool {
			code, body, err = httpGet(base + "/readyz")
			return err == nil && code == want
		}); werr != nil {
			t.Fatalf("/readyz never answered %d (last %d %q %v): %v", want, code, body, err, werr)
		}
		t.Logf("/readyz %d: %s", code, strings.TrimSpace(body))
	}
	waitStatus(200)
	srv.Kill(t)
	waitStatus(503)
	if code, _, err := httpGet(base + "/healthz"); err != nil || code != 200 {
		t.Fatalf("/healthz while the database is down: %d %v; the process is alive", code, err)
	}
	srv.Start(t)
	waitStatus(200)
}

// The bench in its short mode: the JSON parses and every figure of both
// modes is present and non-zero, and so is the catch-up shape's (one shape,
// keys10: the shapes share their code, and each costs seconds here); each
// catch-up's count of repeated deliveries is present and zero (no fault,
// no repeat). --amqp-url lists a cluster's nodes (the second does not
// answer): the relay under test gets them all, bench's own connections
// use the first.
func TestBenchShortModeJSON(t *testing.T) {
	t.Parallel() // a server of its own; its phases are short and fixed (1 s, 500 and 200 messages)
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	ctx := testenv.WorkContext(t)
	url := testenv.RabbitMQ(t).URL + ",amqp://guest:guest@127.0.0.1:1/"
	cmd := exec.CommandContext(ctx, relayBinary(t), "bench", "--mysql-dsn", db.DSN, "--amqp-url", url,
		"--backlog", "500", "--duration", "1s", "--runs", "1", "--shape-backlog", "200", "--shapes", "keys10", "--json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	var res struct {
		BareMsgsPerS     map[string]float64                       `json:"bare_publisher_msgs_per_s"`
		BareLiveMsgsPerS map[string]float64                       `json:"bare_publisher_live_consumer_msgs_per_s"`
		Modes            map[string]map[string]map[string]float64 `json:"modes"`
		Shapes           []struct {
			Shape    string                                   `json:"shape"`
			Bare1000 map[string]float64                       `json:"bare_window_1000_msgs_per_s"`
			BareKeys map[string]float64                       `json:"bare_window_keys_msgs_per_s"`
			Modes    map[string]map[string]map[string]float64 `json:"modes"`
		} `json:"shapes"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, out)
	}
	figures := []string{"latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms",
		"commit_p99_ms", "commit_max_ms", "bare_latency_p50_ms", "bare_latency_p99_ms", "catch_up_msgs_per_s",
		"ratio_to_bare", "catch_up_live_consumer_msgs_per_s", "ratio_to_bare_live_consumer", "idle_queries_per_s", "relay_cpu_seconds", "relay_peak_rss_mib"}
	if res.BareMsgsPerS["median"] <= 0 || res.BareLiveMsgsPerS["median"] <= 0 {
		t.Errorf("bare publisher figure missing or zero: %v, live consumer %v", res.BareMsgsPerS, res.BareLiveMsgsPerS)
	}
	for _, mode := range []string{"binlog", "poll"} {
		m, ok := res.Modes[mode]
		if !ok {
			t.Fatalf("bench JSON has no %s mode:\n%s", mode, out)
		}
		for _, f := range figures {
			for _, k := range []string{"median", "min", "max"} {
				if m[f][k] <= 0 {
					t.Errorf("%s %s.%s = %v, want a positive figure", mode, f, k, m[f][k])
				}
			}
		}
		for _, f := range []string{"catch_up_repeats", "catch_up_live_consumer_repeats"} {
			if r, ok := m[f]["max"]; !ok || r != 0 {
				t.Errorf("%s %s = %v, want present and 0", mode, f, m[f])
			}
		}
	}
	if len(res.Shapes) != 1 || res.Shapes[0].Shape != "keys10" {
		t.Fatalf("bench JSON has %d shapes, want keys10 alone (--shapes keys10):\n%s", len(res.Shapes), out)
	}
	for _, s := range res.Shapes {
		if s.Bare1000["median"] <= 0 || s.BareKeys["median"] <= 0 {
			t.Errorf("shape %s: bare publisher figure missing or zero: %v, window = keys %v", s.Shape, s.Bare1000, s.BareKeys)
		}
		for _, mode := range []string{"binlog", "poll"} {
			for _, f := range []string{"msgs_per_s", "ratio_to_bare_window_1000", "ratio_to_bare_window_keys", "relay_peak_rss_mib"} {
				if v := s.Modes[mode][f]["median"]; v <= 0 {
					t.Errorf("shape %s %s %s = %v, want a positive figure", s.Shape, mode, f, v)
				}
			}
			if r, ok := s.Modes[mode]["repeats"]["max"]; !ok || r != 0 {
				t.Errorf("shape %s %s repeats = %v, want present and 0", s.Shape, mode, s.Modes[mode]["repeats"])
			}
		}
	}
	t.Logf("bench: %s", fmt.Sprint(res.Modes))
}
