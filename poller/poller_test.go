package poller_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/poller"
)

// 6,000 messages over 200 partitions from 8 concurrent producers, one-row
// and 500-row transactions mixed (about 3,000 and 6), polled by 4 workers
// while they are written: each arrives exactly once, in commit order per
// partition, equal to its row; the outbox ends empty (or all marked) and
// nothing failed. (It was 20,000: more of the same interleavings, 35 s more
// of the suite for nothing more asserted.)
func TestRunDeliversEveryMessageOnceInOrder(t *testing.T) {
	const runTotal = 6_000
	for _, mode := range []string{checkpoint.Delete, checkpoint.Mark} {
		t.Run(mode, func(t *testing.T) {
			e := setup(t, mode)
			v := consume(t, e.broker)
			stop, _ := run(t, e.poller(t, func(c *poller.Config) { c.Workers = 4 }))
			ctx := testenv.WorkContext(t)

			produce(ctx, t, e, v, load{producers: 8, partitions: 200, total: runTotal, bigTxn: 500, bigShare: 0.5})
			if err := v.WaitComplete(ctx); err != nil {
				t.Fatal(err)
			}
			if mode == checkpoint.Mark {
				waitRows(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL", 0)
				waitRows(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox", runTotal)
			} else {
				waitRows(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox", 0)
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if err := v.Check(validator.ExactlyOnce); err != nil {
				t.Fatal(err)
			}
			if n := count(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox_failed"); n != 0 {
				t.Fatalf("%d rows in outbox_failed", n)
			}
		})
	}
}

// arrival records when each message id arrived on the test's queue.
func arrivals(t *testing.T, url, queue string) func() map[string]time.Time {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		got = map[string]time.Time{}
	)
	go func() {
		for d := range deliveries {
			mu.Lock()
			if _, dup := got[d.MessageId]; dup {
				t.Errorf("message %s arrived twice", d.MessageId)
			}
			got[d.MessageId] = time.Now()
			mu.Unlock()
		}
	}()
	return func() map[string]time.Time {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]time.Time, len(got))
		for k, v := range got {
			out[k] = v
		}
		return out
	}
}

// A partition [A due, B delayed 2s, C due]: A and C arrive at once, B does
// not hold C back, and B arrives once its time has come.
func TestDelayedRowDoesNotBlockItsPartition(t *testing.T) {
	e := setup(t, checkpoint.Delete)
	got := arrivals(t, e.broker.URL, e.broker.Queue)
	run(t, e.poller(t, nil))
	ctx := testenv.Context(t, time.Minute)

	start := time.Now()
	availableAt := start.Add(2 * time.Second)
	ids, err := outbox.Enqueue(ctx, e.db.SQL,
		outbox.Message{PartitionKey: "order-1", RoutingKey: "a", Payload: []byte(`"A"`)},
		outbox.Message{PartitionKey: "order-1", RoutingKey: "b", Payload: []byte(`"B"`), AvailableAt: availableAt},
		outbox.Message{PartitionKey: "order-1", RoutingKey: "c", Payload: []byte(`"C"`)},
	)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := ids[0].String(), ids[1].String(), ids[2].String()
	for len(got()) < 3 {
		if ctx.Err() != nil {
			t.Fatalf("arrived: %v", got())
		}
		time.Sleep(10 * time.Millisecond)
	}
	at := got()
	t.Logf("A after %v, C after %v, B after %v (available after %v)",
		at[a].Sub(start), at[c].Sub(start), at[b].Sub(start), availableAt.Sub(start))
	if at[a].Sub(start) > time.Second || at[c].Sub(start) > time.Second {
		t.Errorf("A or C not delivered promptly")
	}
	if !at[c].After(at[a]) {
		t.Errorf("C arrived before A")
	}
	// available_at is stored with microseconds; the broker hop only adds.
	if at[b].Before(availableAt) {
		t.Errorf("B arrived %v before its time", availableAt.Sub(at[b]))
	}
	if at[b].Sub(availableAt) > time.Second {
		t.Errorf("B arrived %v after its time", at[b].Sub(availableAt))
	}
}

// Rows with an empty partition_key are claimed by several workers at once and all
// delivered exactly once.
func TestEmptyPartitionKeyRowsSpreadOverWorkers(t *testing.T) {
	e := setup(t, checkpoint.Delete)
	v := consume(t, e.broker)
	ctx := testenv.WorkContext(t)
	produce(ctx, t, e, v, load{producers: 4, total: 6_000, bigTxn: 500, bigShare: 0.9, noKey: true})

	core, logs := observer.New(zap.DebugLevel)
	run(t, e.poller(t, func(c *poller.Config) { c.Workers = 4; c.Batch = 100; c.Logger = zap.New(core) }))
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox", 0)
	for _, entry := range logs.FilterLevelExact(zap.WarnLevel).All() {
		t.Errorf("%s %v", entry.Message, entry.ContextMap())
	}
	rows := map[int64]int64{}
	for _, entry := range logs.FilterMessage("poll round committed").All() {
		f := entry.ContextMap()
		rows[f["worker"].(int64)] += f["rows"].(int64)
	}
	t.Logf("rows per worker: %v", rows)
	// Exactly once: no round is rolled back after its confirms. (Workers
	// acknowledging adjacent rows used to deadlock on a full-scan DELETE,
	// and the rolled-back rounds were published again.)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	if len(rows) < 2 {
		t.Fatalf("rows per worker %v: want them spread over several workers", rows)
	}
}

// Drain empties a 5,000-row backlog and says so.
func TestDrainEmptiesTheTable(t *testing.T) {
	e := setup(t, checkpoint.Delete)
	v := consume(t, e.broker)
	ctx := testenv.WorkContext(t)
	produce(ctx, t, e, v, load{producers: 4, partitions: 300, total: 5_000, bigTxn: 1000, bigShare: 0.9})

	n, err := e.poller(t, nil).Drain(ctx)
	if err != nil {
		var typ, name, status string
		_ = e.pool.QueryRowContext(ctx, "SHOW ENGINE INNODB STATUS").Scan(&typ, &name, &status)
		if i := strings.Index(status, "LATEST DETECTED DEADLOCK"); i >= 0 {
			status = status[i:]
			if j := strings.Index(status, "TRANSACTIONS\n"); j > 0 {
				status = status[:j]
			}
		}
		t.Log(status)
		t.Fatalf("Drain: %v", err)
	}
	if n != 5_000 {
		t.Fatalf("Drain delivered %d, want 5000", n)
	}
	if left := count(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox"); left != 0 {
		t.Fatalf("%d rows left", left)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	// Nothing pending: a second drain has nothing to do.
	if n, err := e.poller(t, nil).Drain(ctx); n != 0 || err != nil {
		t.Fatalf("second Drain: %d, %v", n, err)
	}
}

// A new epoch in the progress row stops Run with checkpoint.ErrFenced, and
// nothing is acknowledged after that.
func TestRunStopsWhenFenced(t *testing.T) {
	e := setup(t, checkpoint.Delete)
	ctx := testenv.WorkContext(t)
	bulkLoad(ctx, t, e.pool, 20_000, 100)
	stop, done := run(t, e.poller(t, func(c *poller.Config) { c.Batch = 100 }))

	waitBelow := func(n int) {
		var left int
		if err := progress.Wait(ctx, "rows polled", func() int64 {
			left = count(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox")
			return int64(left)
		}, func() bool { return left <= n }); err != nil {
			t.Fatalf("%d rows left, want %d or fewer: %v", left, n, err)
		}
	}
	waitBelow(19_000)
	// A round takes a shared lock on the progress row before it commits, so
	// once this UPDATE returns no round of the old epoch can commit any more.
	if _, err := e.pool.ExecContext(ctx, "UPDATE outbox_relay_progress SET epoch = epoch + 1"); err != nil {
		t.Fatal(err)
	}
	atFence := count(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox")
	select {
	case <-done:
	case <-time.After(progress.Patience):
		t.Fatalf("Run did not stop within %v of the epoch bump", progress.Patience)
	}
	if err := stop(); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("Run: %v, want checkpoint.ErrFenced", err)
	}
	// Run has returned, and with it every worker it started.
	if left := count(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox"); left != atFence || left == 0 {
		t.Fatalf("rows left %d, at the epoch bump %d: want the same, above zero (nothing acknowledged after the fence)", left, atFence)
	}
}

// An idle poller sends one statement per interval, whatever its number of
// workers (one polls, the others wait until it finds rows), counted with
// the server's Questions status (this test binary's private server, and no
// other test runs meanwhile).
func TestIdlePollerSendsOneStatementPerInterval(t *testing.T) {
	e := setup(t, checkpoint.Mark)
	ctx := testenv.Context(t, time.Minute)
	// A delivered row and a delayed one: present, but nothing to do.
	if _, err := outbox.Enqueue(ctx, e.db.SQL,
		outbox.Message{PartitionKey: "x", RoutingKey: "r", Payload: []byte("1")},
		outbox.Message{PartitionKey: "x", RoutingKey: "r", Payload: []byte("2"), AvailableAt: time.Now().Add(time.Hour)},
	); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.ExecContext(ctx, "UPDATE outbox SET delivered_at = NOW(6) WHERE available_at IS NULL"); err != nil {
		t.Fatal(err)
	}
	const (
		workers  = 4
		interval = 50 * time.Millisecond
		window   = 2 * time.Second
	)
	questions := func() int {
		var name string
		var n int
		if err := e.pool.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	started := questions()
	run(t, e.poller(t, func(c *poller.Config) { c.Workers = workers; c.Interval = interval }))
	// Measure once every worker has polled (two rounds' worth of statements
	// beside this loop's own): the start-up is not what is under test.
	for own := 1; questions()-started-own < 2*workers; own++ {
		if ctx.Err() != nil {
			t.Fatal("the workers never polled")
		}
		time.Sleep(interval / 5)
	}

	before := questions()
	start := time.Now()
	// The statement rate over an idle window is what is under test, so here
	// a fixed wait is the point.
	time.Sleep(window)
	delta := questions() - before - 1 // the second SHOW counts itself
	if rows, err := e.pool.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name LIKE 'Com\\_%' AND Value > 0"); err == nil {
		for rows.Next() {
			var k, v string
			rows.Scan(&k, &v)
			t.Log(k, v)
		}
		rows.Close()
	}
	elapsed := time.Since(start)
	rounds := int(elapsed / interval)
	t.Logf("%d statements in %v from %d workers, the poller polling every %v (%d intervals)", delta, elapsed, workers, interval, rounds)
	if delta > rounds+1 {
		t.Fatalf("%d statements, want at most one per interval (%d)", delta, rounds+1)
	}
	// Each idle round takes a little longer than the interval (its query);
	// fewer than half would mean the poller is not polling at all.
	if delta < rounds/2 {
		t.Fatalf("%d statements, want about %d", delta, rounds)
	}
	if n := count(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL"); n != 1 {
		t.Fatalf("%d undelivered rows, want the delayed one", n)
	}
}

// A row that cannot be published (headers not a JSON object) and one the
// broker returns (unroutable) go to outbox_failed; their partition moves on.
func TestUndeliverableRowsGoToFailed(t *testing.T) {
	e := setup(t, checkpoint.Delete)
	v := consume(t, e.broker)
	ctx := testenv.Context(t, time.Minute)
	ids, err := outbox.Enqueue(ctx, e.db.SQL,
		outbox.Message{PartitionKey: "o", RoutingKey: "a", Payload: []byte("1")},
		outbox.Message{PartitionKey: "o", Exchange: "amq.direct", RoutingKey: "nowhere", Payload: []byte("2")},
		outbox.Message{PartitionKey: "o", RoutingKey: "b", Payload: []byte("3")},
	)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.SQL.ExecContext(ctx, `INSERT INTO outbox (message_id, partition_key, routing_key, headers, payload)
		VALUES (UNHEX(REPLACE(UUID(), '-', '')), 'o', 'c', '[1,2]', '4')`); err != nil {
		t.Fatal(err)
	}
	last, err := outbox.Enqueue(ctx, e.db.SQL, outbox.Message{PartitionKey: "o", RoutingKey: "d", Payload: []byte("5")})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []outbox.MessageID{ids[0], ids[2], last[0]} {
		v.Expect(validator.Expected{ID: id, PartitionKey: "o", Exchange: e.broker.Exchange, RoutingKey: map[outbox.MessageID]string{
			ids[0]: "a", ids[2]: "b", last[0]: "d"}[id], Payload: map[outbox.MessageID][]byte{ids[0]: []byte("1"), ids[2]: []byte("3"), last[0]: []byte("5")}[id]})
	}
	n, err := e.poller(t, nil).Drain(ctx)
	if err != nil || n != 5 {
		t.Fatalf("Drain: %d, %v; want 5", n, err)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	rows, err := e.pool.QueryContext(ctx, "SELECT routing_key, error FROM outbox_failed ORDER BY outbox_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var failed []string
	for rows.Next() {
		var rk, reason string
		if err := rows.Scan(&rk, &reason); err != nil {
			t.Fatal(err)
		}
		t.Logf("failed %s: %s", rk, reason)
		failed = append(failed, rk)
	}
	if len(failed) != 2 || failed[0] != "nowhere" || failed[1] != "c" {
		t.Fatalf("outbox_failed holds %v, want [nowhere c]", failed)
	}
}

// DrainUntil, with stop closed once 1,000 of 5,000 pending messages have
// arrived, ends between rounds with ErrStopped: the rounds under way commit,
// so every message that arrived has its row acknowledged. A second drain
// delivers the rest: each message exactly once, in order per partition.
func TestDrainUntilStopsBetweenRounds(t *testing.T) {
	e := setup(t, checkpoint.Delete)
	v := consume(t, e.broker)
	ctx := testenv.WorkContext(t)
	produce(ctx, t, e, v, load{producers: 4, partitions: 200, total: 5_000, bigTxn: 500, bigShare: 0.5})

	stop := make(chan struct{})
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := e.poller(t, nil).DrainUntil(ctx, stop)
		done <- result{n, err}
	}()
	waitDelivered(ctx, t, v, 1_000)
	close(stop)
	r := <-done
	if !errors.Is(r.err, poller.ErrStopped) || r.n >= 5_000 {
		t.Fatalf("DrainUntil after stop: %d rows, %v; want fewer than 5000 and ErrStopped", r.n, r.err)
	}
	// Nothing publishes now: what arrived was acknowledged.
	left := count(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox")
	waitFor(ctx, t, func() bool { return v.Missing() <= left })
	if left != v.Missing() || left != 5_000-r.n {
		t.Fatalf("stopped after %d rows: %d rows left, %d messages not delivered", r.n, left, v.Missing())
	}

	if n, err := e.poller(t, nil).Drain(ctx); err != nil || n != left {
		t.Fatalf("second Drain: %d, %v; want %d", n, err, left)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
}

// A drain whose context ends while its rounds publish rolls them back and
// says how many messages they had published (*CutError): a second drain
// publishes again at most that many messages that had arrived.
func TestDrainCutByContextCountsRepeats(t *testing.T) {
	e := setup(t, checkpoint.Delete)
	v := consume(t, e.broker)
	ctx := testenv.WorkContext(t)
	produce(ctx, t, e, v, load{producers: 4, partitions: 200, total: 5_000, bigTxn: 500, bigShare: 0.5})

	drainCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := e.poller(t, nil).Drain(drainCtx)
		done <- err
	}()
	waitDelivered(ctx, t, v, 1_000)
	cancel()
	err := <-done
	said := 0
	var cut *poller.CutError
	switch {
	case errors.As(err, &cut):
		said = cut.Messages
		if !errors.Is(err, context.Canceled) {
			t.Errorf("CutError %v does not wrap context.Canceled", err)
		}
	case !errors.Is(err, context.Canceled):
		t.Fatalf("Drain after cancel: %v; want context.Canceled or a *CutError", err)
	}

	if _, err := e.poller(t, nil).Drain(ctx); err != nil {
		t.Fatalf("second Drain: %v", err)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	t.Logf("cut: %v; %d messages said to be published again, %d duplicate deliveries", err, said, v.Duplicates())
	if d := v.Duplicates(); d > said {
		t.Fatalf("%d duplicate deliveries, the cut said %d messages would be published again", d, said)
	}
}

// waitDelivered waits until v has seen n distinct messages.
func waitDelivered(ctx context.Context, t *testing.T, v *validator.Validator, n int) {
	t.Helper()
	waitFor(ctx, t, func() bool { return v.Received()-v.Duplicates() >= n })
}

// waitFor waits until cond holds, failing the test when ctx ends first.
func waitFor(ctx context.Context, t *testing.T, cond func() bool) {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("condition not met: %v", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// After a round is acknowledged, outbox_relay_progress.last_event_at holds
// the created_at of the newest acknowledged row, as docs/tables.md says,
// in poll mode as in binlog mode.
func TestRunRecordsNewestAcknowledgedRow(t *testing.T) {
	e := setup(t, checkpoint.Delete)
	v := consume(t, e.broker)
	ctx := testenv.WorkContext(t)
	produce(ctx, t, e, v, load{producers: 2, partitions: 20, total: 500})
	var newest time.Time
	if err := e.pool.QueryRowContext(ctx, "SELECT MAX(created_at) FROM outbox").Scan(&newest); err != nil {
		t.Fatal(err)
	}
	stop, _ := run(t, e.poller(t, nil))
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox", 0)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	var got sql.NullTime
	if err := e.pool.QueryRowContext(ctx, "SELECT last_event_at FROM outbox_relay_progress WHERE relay_name = 'default'").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if !got.Valid || !got.Time.Equal(newest) {
		t.Fatalf("last_event_at = %v (set: %v), want the newest row's created_at %v", got.Time, got.Valid, newest)
	}
}
