package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestBenchSoakShortJSON runs `bench --soak` for a few seconds per mode
// (the short form of the soak) and checks that each mode relayed the
// stream and reported every figure at start, during and at the end, with
// a slope. Speed and slopes are reported, not asserted. The writers keep to
// 300 transactions a second: the figures need a stream, not the machine's
// whole speed, and the suite runs beside it.
func TestBenchSoakShortJSON(t *testing.T) {
	t.Parallel()
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	ctx := testenv.WorkContext(t)
	cmd := exec.CommandContext(ctx, relayBinary(t), "bench", "--mysql-dsn", db.DSN, "--amqp-url", testenv.RabbitMQ(t).URL,
		"--soak", "6s", "--soak-report", "2s", "--soak-rate", "300", "--json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench --soak: %v\n%s", err, stderr.String())
	}
	t.Logf("report lines:\n%s", stderr.String())
	var res struct {
		Modes []struct {
			Mode      string  `json:"mode"`
			Written   int64   `json:"written"`
			Published float64 `json:"published"`
			CPUPerMsg float64 `json:"relay_cpu_us_per_msg"`
			Figures   []struct {
				Name  string  `json:"name"`
				Start float64 `json:"start"`
				End   float64 `json:"end"`
			} `json:"figures"`
			Samples []json.RawMessage `json:"samples"`
		} `json:"modes"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("bench --soak JSON: %v\n%s", err, out)
	}
	if len(res.Modes) != 2 || res.Modes[0].Mode != "binlog" || res.Modes[1].Mode != "poll" {
		t.Fatalf("bench --soak JSON: want binlog then poll:\n%s", out)
	}
	for _, m := range res.Modes {
		if m.Written <= 0 || m.Published <= 0 {
			t.Errorf("%s: %d written, %v published: want both positive", m.Mode, m.Written, m.Published)
		}
		if len(m.Samples) < 3 {
			t.Errorf("%s: %d samples, want the start, the periods and the end", m.Mode, len(m.Samples))
		}
		figures := map[string]float64{}
		for _, f := range m.Figures {
			figures[f.Name] = f.End
		}
		for _, name := range []string{"live heap (MiB)", "heap alloc low point (MiB)", "RSS (MiB)", "goroutines",
			"open files", "relay DB connections", "server Threads_connected"} {
			if v, ok := figures[name]; !ok || v <= 0 {
				t.Errorf("%s: figure %q at the end = %v (present %v), want a positive figure", m.Mode, name, v, ok)
			}
		}
		// Per period it may be 0 (a short period that published nothing).
		if _, ok := figures["relay CPU per message (µs)"]; !ok || m.CPUPerMsg <= 0 {
			t.Errorf("%s: relay CPU per message over the soak %v (per period present: %v), want a positive figure", m.Mode, m.CPUPerMsg, ok)
		}
	}
	if !strings.Contains(stderr.String(), "soak binlog") || !strings.Contains(stderr.String(), "soak poll") {
		t.Errorf("no report lines on stderr with --json:\n%s", stderr.String())
	}
}
