package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// The bench into the streams at a tiny size (one run, binlog mode, 2
// partitions, 1 s of latency at 200 msg/s, a backlog of 300): the report
// holds the relay's figures and the bare stream producer's, and every
// message arrived (bench fails a phase whose consumer misses one; none
// repeated).
func TestBenchStreamsShort(t *testing.T) {
	t.Parallel() // the phases are short and fixed; no figure counts the server's statements, so the shared server serves
	db := testenv.MySQL(t)
	ctx := testenv.WorkContext(t)
	url := testenv.RabbitMQ(t).URL
	cmd := exec.CommandContext(ctx, relayBinary(t), "bench", "--mysql-dsn", db.DSN, "--amqp-url", url, "--stream-partitions", "2",
		"--modes", "binlog", "--runs", "1", "--duration", "1s", "--latency-rate", "200", "--backlog", "300", "--json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	began := time.Now()
	out, err := cmd.Output()
	took := time.Since(began)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	var res struct {
		Modes  map[string]any `json:"modes"`
		Stream *struct {
			Partitions   int                                      `json:"partitions"`
			Bare         map[string]float64                       `json:"bare_producer_msgs_per_s"`
			BareConfirmd map[string]float64                       `json:"bare_producer_confirmed_msgs_per_s"`
			Modes        map[string]map[string]map[string]float64 `json:"modes"`
		} `json:"stream"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, out)
	}
	if res.Stream == nil || res.Stream.Partitions != 2 || len(res.Modes) != 0 {
		t.Fatalf("bench JSON: want the stream destination's figures alone, for 2 partitions:\n%s", out)
	}
	if res.Stream.Bare["median"] <= 0 || res.Stream.BareConfirmd["median"] <= 0 {
		t.Errorf("bare stream producer's figures missing or zero: %v, until confirmed %v", res.Stream.Bare, res.Stream.BareConfirmd)
	}
	m, ok := res.Stream.Modes["binlog"]
	if !ok {
		t.Fatalf("bench JSON has no binlog mode:\n%s", out)
	}
	for _, f := range []string{"latency_p50_ms", "latency_p99_ms", "latency_max_ms", "bare_latency_p50_ms", "bare_latency_p99_ms",
		"catch_up_published_msgs_per_s", "ratio_to_bare_published", "catch_up_msgs_per_s", "ratio_to_bare", "relay_cpu_seconds", "relay_peak_rss_mib"} {
		if v := m[f]["median"]; v <= 0 {
			t.Errorf("binlog %s = %v, want a positive figure", f, v)
		}
	}
	if r, ok := m["catch_up_repeats"]["max"]; !ok || r != 0 {
		t.Errorf("catch_up_repeats = %v, want present and 0", m["catch_up_repeats"])
	}
	t.Logf("bench into the streams took %v: %s", took.Round(time.Millisecond), out)
}
