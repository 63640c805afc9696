package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/metrics"
)

// In poll mode the backlog metrics follow the backlog. While rows are
// produced faster than the relay delivers them (the broker slowed by a fault
// proxy, one worker claiming one row per round), outbox_relay_pending_rows
// and outbox_relay_lag_seconds grow and the in-flight gauges show the round
// under way; once the broker is fast again and every row has arrived, all
// four are back at 0.
func TestPollModeMetricsFollowTheBacklog(t *testing.T) {
	t.Parallel()
	const rows = 300
	db, b := setup(t)
	v := consume(t, b, b.Queue) // directly on the broker: only the relay is slowed
	proxy := testenv.Proxy(t, brokerAddr(t, b.URL))
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	startRelay(t, db, b, func(c *Config) {
		c.Mode, c.PollWorkers, c.PollBatch, c.Metrics = ModePoll, 1, 1, m
		c.AMQPURL = viaProxy(t, b.URL, proxy.Addr())
	})
	ctx := testenv.WorkContext(t)

	// A round publishes one row and waits for its confirm: at least 200 ms
	// through the proxy, so at most 5 rows a second leave, while the stream
	// writes one every 10 ms or so.
	proxy.SetLatency(100 * time.Millisecond)
	s := startStream(ctx, db.SQL, v, b.Exchange, rows, 10*time.Millisecond)
	gauges := func() (pending, lag, msgs, bytes float64) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		v := map[string]float64{}
		for _, mf := range mfs {
			if ms := mf.GetMetric(); len(ms) == 1 && ms[0].GetGauge() != nil {
				v[mf.GetName()] = ms[0].GetGauge().GetValue()
			}
		}
		return v["outbox_relay_pending_rows"], v["outbox_relay_lag_seconds"],
			v["outbox_relay_inflight_messages"], v["outbox_relay_inflight_bytes"]
	}
	var maxMsgs, maxBytes float64
	grew := func() bool {
		pending, lag, msgs, bytes := gauges()
		maxMsgs, maxBytes = max(maxMsgs, msgs), max(maxBytes, bytes)
		// A round in flight holds one row of about 2 KiB.
		return pending >= 50 && lag >= 3 && maxMsgs >= 1 && maxBytes >= 2048
	}
	err = pollUntil(ctx, grew)
	if err != nil {
		pending, lag, _, _ := gauges()
		t.Fatalf("polling behind a growing backlog (%d rows in the outbox, %d delivered): pending_rows %.0f, lag_seconds %.1f, "+
			"at most %.0f messages and %.0f bytes in flight; want pending_rows >= 50, lag_seconds >= 3 and a round in flight",
			count(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox"), distinct(v), pending, lag, maxMsgs, maxBytes)
	}
	pending, lag, _, _ := gauges()
	t.Logf("behind: pending_rows %.0f, lag_seconds %.1f, in flight up to %.0f messages, %.0f bytes", pending, lag, maxMsgs, maxBytes)

	proxy.SetLatency(0)
	if err := <-s.done; err != nil {
		t.Fatal(err)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	if err := pollUntil(ctx, func() bool {
		pending, lag, msgs, bytes := gauges()
		return pending == 0 && lag == 0 && msgs == 0 && bytes == 0
	}); err != nil {
		pending, lag, msgs, bytes := gauges()
		t.Fatalf("caught up: pending_rows %.0f, lag_seconds %.1f, in flight %.0f messages, %.0f bytes; want all 0",
			pending, lag, msgs, bytes)
	}
}

// readBacklog counts what `status` calls pending (delivered rows aside,
// delayed rows included) up to its limit, and its lag is how long the
// oldest due row has been due: a delayed row counts from its available_at,
// and one not yet due not at all.
func TestReadBacklog(t *testing.T) {
	db, _ := setup(t)
	ctx := testenv.Context(t, time.Minute)
	insert := func(created, available, delivered string) {
		t.Helper()
		if _, err := db.SQL.ExecContext(ctx, "INSERT INTO outbox (message_id, routing_key, payload, created_at, available_at, delivered_at)"+
			" VALUES (UNHEX(REPLACE(UUID(), '-', '')), 'rk', '{}', "+created+", "+available+", "+delivered+")"); err != nil {
			t.Fatal(err)
		}
	}
	ago := func(s int) string { return fmt.Sprintf("UTC_TIMESTAMP(6) - INTERVAL %d SECOND", s) }
	check := func(step string, limit int, rows int64, lag float64) {
		t.Helper()
		b, err := readBacklog(ctx, db.SQL, "outbox", limit)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		// The rows were dated when inserted, the lag is reckoned later.
		if b.rows != rows || b.lag < lag || b.lag > lag+30 || b.due != (lag > 0) {
			t.Errorf("%s: %d rows, lag %.1fs (due %v); want %d rows, lag %.0fs", step, b.rows, b.lag, b.due, rows, lag)
		}
	}
	check("empty", 100, 0, 0)
	insert(ago(3*3600), "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR", "NULL") // delayed, not due
	check("one row not yet due", 100, 1, 0)
	insert(ago(86400), "NULL", ago(86000)) // delivered (--on-delivered=mark)
	insert(ago(120), "NULL", "NULL")
	insert(ago(10), "NULL", "NULL")
	insert(ago(300), ago(30), "NULL") // delayed, due for 30 s
	check("oldest immediate row 120 s old", 100, 4, 120)
	insert(ago(300), ago(200), "NULL") // delayed, due for 200 s
	check("a delayed row due for 200 s", 100, 5, 200)
	insert(ago(400), ago(500), "NULL") // available before it was created: due since created
	check("a row due since its creation 400 s ago", 100, 6, 400)
	check("limit", 4, 4, 400)
}
