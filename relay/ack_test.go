package relay

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// stream is one producer writing one-row transactions of 2 KiB at a steady
// pace over a few partitions, telling v each committed message; last is the
// outbox id of its newest committed row (one producer: ids grow in commit
// order).
type stream struct {
	last atomic.Uint64
	done chan error
}

func startStream(ctx context.Context, db *sql.DB, v *validator.Validator, exchange string, n int, pace time.Duration) *stream {
	s := &stream{done: make(chan error, 1)}
	go func() {
		s.done <- func() error {
			for i := range n {
				pk := fmt.Sprintf("stream-%d", i%8)
				m := outbox.Message{PartitionKey: pk, Exchange: exchange, RoutingKey: "rk." + pk,
					Payload: fmt.Appendf(nil, `{"n":%d,"pad":"%02048d"}`, i, 0)}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				ids, err := outbox.Enqueue(ctx, tx, m)
				var id uint64
				if err == nil {
					err = tx.QueryRowContext(ctx, "SELECT LAST_INSERT_ID()").Scan(&id)
				}
				if err == nil {
					err = tx.Commit()
				}
				if err != nil {
					_ = tx.Rollback()
					return fmt.Errorf("stream row %d: %w", i, err)
				}
				s.last.Store(id)
				v.Expect(validator.Expected{ID: ids[0], PartitionKey: pk, Exchange: exchange, RoutingKey: m.RoutingKey, Payload: m.Payload})
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(pace):
				}
			}
			return nil
		}()
	}()
	return s
}

func progressEpoch(ctx context.Context, t *testing.T, db *testenv.DB) int64 {
	t.Helper()
	var epoch int64
	if err := db.SQL.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ?", relayNameFor(db.Name)).Scan(&epoch); err != nil {
		t.Fatalf("read the leader epoch: %v", err)
	}
	return epoch
}

// An acknowledgement that finds the progress row at a newer epoch ends the
// leader term at once, not at the next heartbeat (here a minute away):
// messages published under the old epoch after the bump are what the relay
// had read by then, the term ends (the relay takes leadership again, with a
// new epoch) within seconds, and the stream then arrives whole.
func TestRelayAckFencedEndsTermAtOnce(t *testing.T) {
	t.Parallel()
	const budget = 1 << 20 // the least --max-inflight-bytes
	db, b := setup(t)
	v := consume(t, b, b.Queue)
	startRelay(t, db, b, func(c *Config) { c.HeartbeatInterval, c.MaxInflightBytes = time.Minute, budget })
	ctx := testenv.WorkContext(t)

	s := startStream(ctx, db.SQL, v, b.Exchange, 2_000, 3*time.Millisecond)
	waitReceived(ctx, t, v, 300)
	epoch := progressEpoch(ctx, t, db)
	// A newer leader's term, already ended cleanly (leader_instance NULL):
	// one that had not would have to be waited out for its lease.
	if _, err := db.SQL.ExecContext(ctx, "UPDATE outbox_relay_progress SET epoch = epoch + 1, leader_instance = NULL WHERE relay_name = ?", relayNameFor(db.Name)); err != nil {
		t.Fatal(err)
	}
	bumped, lastBefore := time.Now(), s.last.Load()

	// The relay takes leadership again as soon as its term has ended:
	// nobody else holds the lock. The heartbeat alone would notice the
	// bump only up to a minute later.
	for progressEpoch(ctx, t, db) != epoch+2 {
		if time.Since(bumped) > 20*time.Second {
			t.Fatalf("20 s after the epoch bump the relay's term had not ended (heartbeat interval 1 min)")
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	ended := time.Since(bumped)
	if err := <-s.done; err != nil {
		t.Fatal(err)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)

	// Rows committed after the bump that went out under the old epoch: the
	// old term may publish what it had read when it noticed, no more. Its
	// budget holds at most budget / (the smallest row's size) rows without
	// an outcome.
	smallest := &outbox.Record{PartitionKey: "stream-0", Exchange: b.Exchange, RoutingKey: "rk.stream-0",
		Payload: fmt.Appendf(nil, `{"n":0,"pad":"%02048d"}`, 0), ContentType: "application/json"}
	oldAfter, newTerm := 0, 0
	for _, d := range v.Deliveries() {
		id, _ := d.Headers["x-outbox-id"].(int64)
		e, _ := d.Headers["x-relay-epoch"].(int64)
		switch {
		case e == epoch && uint64(id) > lastBefore:
			oldAfter++
		case e == epoch+2:
			newTerm++
		}
	}
	t.Logf("term ended %v after the epoch bump; %d rows committed after it went out under the old epoch %d; new term %d published %d; %d duplicates",
		ended.Round(time.Millisecond), oldAfter, epoch, epoch+2, newTerm, v.Duplicates())
	if limit := budget / smallest.Size(); oldAfter > limit {
		t.Fatalf("%d rows committed after the epoch bump were published under the old epoch: want at most what its budget holds in flight (%d)", oldAfter, limit)
	}
	if newTerm == 0 {
		t.Fatal("the new term published nothing: the test did not exercise the restart")
	}
}

// metricValue reads one gauge of the relay's registry.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// counterValue is the value of reg's counter name (one series).
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// While no acknowledgement can commit (the relay's user lost DELETE on the
// outbox), the relay keeps what it has read within --max-inflight-bytes and
// stops reading once that is full, instead of reading on and holding
// everything until the acknowledgements pass again. Then, with DELETE
// granted back, everything arrives, in order per key, and is acknowledged.
func TestRelayStopsReadingWhileAcknowledgementsFail(t *testing.T) {
	t.Parallel()
	const budget, rows = 1 << 20, 6_000 // the least --max-inflight-bytes; rows of about 400 bytes
	srv, db, b := privateSetup(t)
	root := srv.Root(t)
	for _, q := range []string{
		"CREATE USER 'relay'@'127.0.0.1' IDENTIFIED BY 'relay-secret'",
		// DELETE on the outbox table alone, so it can be taken away alone.
		"GRANT SELECT, INSERT, UPDATE ON `" + db.Name + "`.* TO 'relay'@'127.0.0.1'",
		"GRANT DELETE ON `" + db.Name + "`.outbox TO 'relay'@'127.0.0.1'",
		"GRANT DELETE ON `" + db.Name + "`.outbox_relay_instances TO 'relay'@'127.0.0.1'",
		"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'relay'@'127.0.0.1'",
	} {
		if _, err := root.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	v := consume(t, b, b.Queue)
	startRelay(t, db, b, func(c *Config) {
		c.MySQLDSN = fmt.Sprintf("relay:relay-secret@tcp(%s)/%s", srv.Addr(), db.Name)
		c.MaxInflightBytes, c.Metrics = budget, m
	})
	ctx := testenv.WorkContext(t)
	produce(ctx, t, db, b, v, load{producers: 2, partitions: 8, total: 100})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)

	if _, err := root.ExecContext(ctx, "REVOKE DELETE ON `"+db.Name+"`.outbox FROM 'relay'@'127.0.0.1'"); err != nil {
		t.Fatal(err)
	}
	produce(ctx, t, db, b, v, load{producers: 4, partitions: 40, total: rows, bigTxn: 200, bigShare: 0.5})

	// The budget fills: every row read has its outcome and has arrived, and
	// what is held leaves no room for another row (rows here count well
	// under 4 KiB). The pipeline's gauges are refreshed at each acknowledgement
	// attempt; published_total counts every row read (each is confirmed),
	// the 100 of the first load included.
	const slack = 4 << 10 // a row here counts about 2.5 KiB (outbox.RecordOverhead)
	check := func() (msgs, bytes, read float64) {
		t.Helper()
		msgs = metricValue(t, reg, "outbox_relay_inflight_messages")
		bytes = metricValue(t, reg, "outbox_relay_inflight_bytes")
		read = counterValue(t, reg, "outbox_relay_published_total") - 100
		if bytes > budget+slack {
			t.Fatalf("%.0f bytes held, --max-inflight-bytes %d", bytes, budget)
		}
		return msgs, bytes, read
	}
	unique := func() int { return v.Received() - v.Duplicates() - 100 }
	var held float64
	step, cancel := progress.Step(ctx)
	defer cancel()
	for {
		msgs, bytes, read := check()
		if msgs == 0 && bytes > budget-slack && float64(unique()) == read {
			held = read
			break
		}
		if unique() >= rows {
			t.Fatalf("all %d rows were read and published while no acknowledgement could commit: reading did not stop at the budget", rows)
		}
		select {
		case <-step.Done():
			t.Fatalf("the budget never filled (%.0f messages, %.0f bytes, %.0f rows read; %d arrived): %v", msgs, bytes, read, unique(), step.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	// Reading has stopped: over the next seconds nothing more is read or
	// published, although most of the rows are waiting. Nothing would end
	// this wait earlier, so a fixed wait is the assertion itself.
	time.Sleep(2 * time.Second)
	if _, _, read := check(); read != held || unique() != int(held) || int(held) >= rows {
		t.Fatalf("%.0f of %d rows read when the budget filled; two seconds later %.0f read, %d published: want reading stopped", held, rows, read, unique())
	}
	if n := count(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox"); n != rows {
		t.Fatalf("%d rows in the outbox, want all %d (no acknowledgement could commit)", n, rows)
	}
	// The backlog metrics see the whole table, not only what was read.
	if err := pollUntil(ctx, func() bool {
		return metricValue(t, reg, "outbox_relay_pending_rows") == rows && metricValue(t, reg, "outbox_relay_lag_seconds") > 0
	}); err != nil {
		t.Fatalf("pending_rows %.0f, lag_seconds %.1f with all %d rows pending and %.0f read: want %d and a lag",
			metricValue(t, reg, "outbox_relay_pending_rows"), metricValue(t, reg, "outbox_relay_lag_seconds"), rows, held, rows)
	}
	t.Logf("reading stopped after %.0f of %d rows with acknowledgements failing", held, rows)

	if _, err := root.ExecContext(ctx, "GRANT DELETE ON `"+db.Name+"`.outbox TO 'relay'@'127.0.0.1'"); err != nil {
		t.Fatal(err)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	t.Logf("%d deliveries, %d duplicates", v.Received(), v.Duplicates())
}

func count(ctx context.Context, t *testing.T, db *sql.DB, q string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}
