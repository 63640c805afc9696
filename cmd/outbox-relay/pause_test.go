package main

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// pause and resume under a producing stream, in each mode: pause returns
// once the leader has stopped; while paused the outbox keeps filling and
// nothing committed after the pause is published, the checkpoint and the
// epoch stay, status and the metrics show the pause and /readyz stays 200;
// checkpoint set is accepted; after resume every message arrives exactly
// once, in order per partition key.
func TestCLIPauseResume(t *testing.T) {
	t.Parallel() // servers of its own (privateDB); mostly waits
	for _, mode := range []string{"binlog", "poll"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testPauseResume(t, mode)
		})
	}
}

func testPauseResume(t *testing.T, mode string) {
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	v := consumeAll(t, b)
	seen := newEpochConsumer(t, b)
	// A heartbeat far longer than the test takes up to the pause: the
	// leader's first heartbeat comes a heartbeat interval after it took
	// leadership, so a leader that stops before then noticed the pause
	// only because pause woke it.
	const heartbeat, lease = time.Minute, 3 * time.Minute
	p := newRelayProc(t, relayArgs(t, db, b, "--mode", mode, "--heartbeat-interval", heartbeat.String(), "--leader-lease", lease.String())...)
	started := time.Now()
	p.start()
	base := p.metricsURL(ctx)
	p.waitLog(ctx, "leading")

	var stopProd atomic.Bool
	prodDone := make(chan error, 1)
	go func() {
		for !stopProd.Load() {
			if err := testload.Run(ctx, db.SQL, v, testload.Load{
				Producers: 2, Partitions: 20, Total: 200, Exchange: b.Exchange, Pace: 2 * time.Millisecond,
			}); err != nil {
				prodDone <- err
				return
			}
		}
		prodDone <- nil
	}()
	all := func(epochDelivery) bool { return true }
	seen.waitFor(ctx, t, "before the pause", 300, all)
	if mode == "binlog" {
		// A checkpoint to compare with: a first start delivers the rows
		// written before its binlog position by a sweep first, which a
		// slow machine may still be running at 300 deliveries.
		waitStatus(ctx, t, db, "a stored checkpoint", func(s statusJSON) bool { return s.Checkpoint.GTIDSet != nil })
	}
	epoch := progressEpoch(ctx, t, db)

	began := time.Now()
	r := ops(t, db, "pause", "--json", "--leader-lease", lease.String(), "--wait", pauseWait)
	took := time.Since(began)
	var paused pauseJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &paused) != nil || paused.Status != "PAUSED" || paused.Was != "ACTIVE" ||
		paused.Paused == nil || !paused.Paused.LeaderStopped || paused.Leader == nil || !paused.Leader.Alive {
		t.Fatalf("pause: %+v", r)
	}
	if since := time.Since(started); since >= heartbeat {
		t.Errorf("the leader stopped %v after the relay started, not before its first heartbeat (%v): cannot tell whether pause woke it", since, heartbeat)
	}
	// Every id from here on belongs to a row committed after the leader
	// stopped reading.
	var next int64
	if err := db.SQL.QueryRowContext(ctx, `SELECT AUTO_INCREMENT FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox'`).Scan(&next); err != nil {
		t.Fatal(err)
	}
	// Paused while the outbox fills: the wait for rows is the condition,
	// not a sleep.
	var written int64
	if err := progress.Wait(ctx, "rows written while paused", func() int64 {
		if err := db.SQL.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE id >= ?", next).Scan(&written); err != nil {
			t.Fatal(err)
		}
		return written
	}, func() bool { return written >= 300 }); err != nil {
		t.Fatalf("producers wrote %d rows while paused: %v", written, err)
	}
	s := statusOf(t, db, "--leader-lease", lease.String())
	if s.Status != "PAUSED" || s.Paused == nil || !s.Paused.LeaderStopped || s.Paused.Seconds <= 0 || s.Epoch != epoch ||
		s.Leader == nil || !s.Leader.Alive || s.PendingRows < 300 {
		t.Errorf("status while paused: %+v", s)
	}
	if mode == "binlog" && (s.Checkpoint.GTIDSet == nil || paused.Checkpoint.GTIDSet == nil || *s.Checkpoint.GTIDSet != *paused.Checkpoint.GTIDSet) {
		t.Fatalf("checkpoint moved while paused: %v, stopped at %v", s.Checkpoint.GTIDSet, paused.Checkpoint.GTIDSet)
	}
	if g, sec := metricValue(t, base, "outbox_relay_paused"), metricValue(t, base, "outbox_relay_paused_seconds"); g != 1 || sec <= 0 {
		t.Errorf("metrics while paused: outbox_relay_paused %v, outbox_relay_paused_seconds %v", g, sec)
	}
	// The backlog metrics follow the outbox while paused, so an alert on
	// the lag fires for a long pause (the leader counts every 5 s).
	var pending, lag float64
	if err := progress.Wait(ctx, "backlog metrics while paused", nil, func() bool {
		pending, lag = metricValue(t, base, "outbox_relay_pending_rows"), metricValue(t, base, "outbox_relay_lag_seconds")
		return pending >= 300 && lag > 0
	}); err != nil {
		t.Fatalf("while paused with %d rows pending: outbox_relay_pending_rows %v, outbox_relay_lag_seconds %v; want at least 300 and above 0: %v",
			s.PendingRows, pending, lag, err)
	}
	if code, body, err := httpGet(base + "/readyz"); err != nil || code != 200 {
		t.Errorf("/readyz while paused: %d %q %v", code, body, err)
	}
	if n := seen.count(func(d epochDelivery) bool { return d.outboxID >= next }); n > 0 {
		t.Errorf("%d rows committed after the pause were published while paused", n)
	}
	if mode == "binlog" {
		// Paused and stopped: the checkpoint may be set (here to where it
		// stopped, so exactly once still holds).
		if r := ops(t, db, "checkpoint", "set", "--gtid", *paused.Checkpoint.GTIDSet, "--leader-lease", lease.String()); r.code != 0 {
			t.Fatalf("checkpoint set while paused: %+v", r)
		}
	}

	r = ops(t, db, "resume", "--leader-lease", lease.String())
	if r.code != 0 || !strings.Contains(r.stdout, "resumed; leader") {
		t.Fatalf("resume: %+v", r)
	}
	stopProd.Store(true)
	if err := <-prodDone; err != nil {
		t.Fatal(err)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	if e := progressEpoch(ctx, t, db); e != epoch {
		t.Errorf("epoch went from %d to %d across pause and resume", epoch, e)
	}
	if g := metricValue(t, base, "outbox_relay_paused"); g != 0 {
		t.Errorf("outbox_relay_paused %v after resume", g)
	}
	out := p.output()
	want := []string{"paused by an operator", "resumed by an operator"}
	if mode == "binlog" {
		want = append(want, "checkpoint set by an operator")
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("the relay's log lacks %q", w)
		}
	}
	t.Logf("%s: pause returned after %v (leader stopped); %d messages delivered exactly once", mode, took.Round(time.Millisecond), v.Received())
	if code, _ := p.terminate(30 * time.Second); code != 0 {
		t.Errorf("SIGTERM: exit code %d", code)
	}
}

// pause and resume without a leader: an unknown relay name is bad usage
// (2); a relay that is not paused resumes with nothing changed; a relay
// paused with no leader running is paused at once, and the next leader
// starts paused, publishing nothing until resume.
func TestCLIPauseWithoutLeader(t *testing.T) {
	ctx := testenv.WorkContext(t)
	db := testenv.MySQL(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	if r := ops(t, db, "resume", "--relay-name", "nope"); r.code != 2 || !strings.Contains(r.stderr, "nope") {
		t.Fatalf("resume of an unknown relay: %+v", r)
	}
	opsExec(t, db, "INSERT INTO outbox_relay_progress (relay_name) VALUES ('other')")
	if r := ops(t, db, "resume", "--relay-name", "other"); r.code != 0 || !strings.Contains(r.stdout, "not paused; nothing changed") {
		t.Fatalf("resume of an active relay: %+v", r)
	}
	opsExec(t, db, "DELETE FROM outbox_relay_progress WHERE relay_name = 'other'")
	// Before any relay ran with the name: the first one starts paused.
	if r := ops(t, db, "pause"); r.code != 0 || !strings.Contains(r.stdout, "no relay has run with this name yet") {
		t.Fatalf("pause before any run: %+v", r)
	}
	if r := ops(t, db, "pause"); r.code != 0 || !strings.Contains(r.stdout, "no leader is running") {
		t.Fatalf("pause again without a leader: %+v", r)
	}
	s := statusOf(t, db)
	if s.Status != "PAUSED" || s.Paused == nil || s.Paused.LeaderStopped || s.Paused.Since == nil {
		t.Fatalf("status after pause without a leader: %+v", s)
	}
	if r := ops(t, db, "pause", "stray"); r.code != 2 {
		t.Fatalf("pause with an argument: %+v", r)
	}

	v := consumeAll(t, b)
	testload.Produce(ctx, t, db.SQL, v, testload.Load{Producers: 1, Partitions: 4, Total: 40, Exchange: b.Exchange})
	p := newRelayProc(t, relayArgs(t, db, b, leaderFlags()...)...)
	p.start()
	p.waitLog(ctx, "paused by an operator")
	s = statusOf(t, db)
	if s.Paused == nil || !s.Paused.LeaderStopped || s.Leader == nil || !s.Leader.Alive || s.PendingRows != 40 {
		t.Fatalf("status of a leader started paused: %+v", s)
	}
	if n := v.Received(); n != 0 {
		t.Fatalf("a leader started paused published %d messages", n)
	}
	if r := ops(t, db, "resume"); r.code != 0 {
		t.Fatalf("resume: %+v", r)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	if code, _ := p.terminate(30 * time.Second); code != 0 {
		t.Errorf("SIGTERM: exit code %d", code)
	}
}

// A pause and a SIGTERM while a fresh relay delivers the rows pending at its
// first start (the sweep before it tails the binlog) each let the poll rounds
// under way finish: what they published is acknowledged, so neither repeats
// anything. 10,000 rows pending; pause once 2,000 have arrived; resume;
// SIGTERM after 3,000 more; start again: every message exactly once, in
// order per partition key.
func TestCLIPauseAndStopDuringFirstStartSweep(t *testing.T) {
	heavy(t) // a server of its own (privateDB)
	const total = 10_000
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	v := consumeAll(t, b)
	testload.Produce(ctx, t, db.SQL, v, testload.Load{
		Producers: 4, Partitions: 200, Total: total, BigTxn: 500, BigShare: 0.5, Exchange: b.Exchange,
	})
	p := newRelayProc(t, relayArgs(t, db, b, leaderFlags()...)...)
	p.start()
	// inSweep fails the test when the relay has finished the sweep: a stop
	// after it proves nothing here.
	inSweep := func(what string) {
		t.Helper()
		if strings.Contains(p.output(), "delivered pending rows before tailing") || unique(v) >= total {
			t.Fatalf("%s came after the first start's sweep (%d messages arrived): it proves nothing", what, unique(v))
		}
	}

	waitUnique(ctx, t, v, p, 2_000)
	r := ops(t, db, "pause", "--leader-lease", testLease.String(), "--wait", pauseWait)
	if r.code != 0 || !strings.Contains(r.stdout, "stopped at checkpoint") {
		t.Fatalf("pause: %+v", r)
	}
	inSweep("the pause")
	checkAcknowledged(ctx, t, db, v, "the pause")
	at := unique(v)
	if r := ops(t, db, "resume", "--leader-lease", testLease.String()); r.code != 0 {
		t.Fatalf("resume: %+v", r)
	}
	waitUnique(ctx, t, v, p, at+3_000)
	if code, _ := p.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM: exit code %d", code)
	}
	inSweep("SIGTERM")
	checkAcknowledged(ctx, t, db, v, "SIGTERM")

	p.start()
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	if code, _ := p.terminate(time.Minute); code != 0 {
		t.Errorf("SIGTERM at the end: exit code %d", code)
	}
}

// A stop whose work under way outlasts --shutdown-timeout (the broker stops
// answering through a fault proxy) cuts it, and the relay says so at WARN
// with how many messages will be published again: after a restart every
// message has arrived, in order per partition key, and fewer messages than
// it said arrived twice. Cut are the poll rounds of the first start's sweep,
// and a 10,000-row transaction being read in binlog mode.
func TestCLIStopTimeoutLogsRepeats(t *testing.T) {
	heavy(t) // servers of their own (privateDB); the cases one after the other
	for _, tc := range []struct {
		name, warn string
		pending    bool // the rows are pending at the first start, else one transaction written while tailing
	}{
		{"sweep", "the rounds delivering pending rows did not finish within --shutdown-timeout", true},
		{"transaction", "the transaction being read did not end within --shutdown-timeout", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Enough rows that the stop, once 1,000 have arrived, cuts the
			// work under way: 10,000 in one transaction (6,000 were read
			// whole before the stop); 6,000 pending (the sweep's rounds
			// are 500 rows).
			total := 10_000
			if tc.pending {
				total = 6_000
			}
			ctx := testenv.WorkContext(t)
			db := privateDB(t)
			b := testenv.RabbitMQ(t)
			migrate(t, db.DSN)
			v := consumeAll(t, b) // on the broker itself: only the relay's connections stall
			proxy, proxied := brokerProxy(t, b)
			load := testload.Load{Producers: 1, Partitions: 50, Total: total, BigTxn: total, BigShare: 1, Exchange: b.Exchange}
			if tc.pending {
				load = testload.Load{Producers: 4, Partitions: 200, Total: total, BigTxn: 500, BigShare: 0.5, Exchange: b.Exchange}
				testload.Produce(ctx, t, db.SQL, v, load)
			}
			p := newRelayProc(t, relayArgs(t, db, b, append(leaderFlags(),
				"--amqp-url", proxied, "--shutdown-timeout", "2s")...)...)
			p.start()
			if !tc.pending {
				// A checkpoint stored before the transaction: the restart
				// tails from it (a first start would deliver only the rows
				// still pending).
				testload.Produce(ctx, t, db.SQL, v, testload.Load{Producers: 1, Partitions: 1, Total: 1, Exchange: b.Exchange, PartitionOffset: 50})
				testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox_relay_progress WHERE gtid_set <> ''", 1)
				testload.Produce(ctx, t, db.SQL, v, load)
			}
			waitUnique(ctx, t, v, p, 1_000)
			proxy.Stall()
			if tc.pending {
				// A round must be under way at the stop, else the stop
				// comes between rounds and cuts nothing: wait for one
				// holding messages the stalled broker does not answer.
				waitInflight(ctx, t, p.metricsURL(ctx))
			}
			p.signal(syscall.SIGTERM)
			p.waitLog(ctx, tc.warn)
			proxy.Unstall() // lets the exit close its broker connections
			if code, ok := p.wait(time.Minute); !ok || code != 0 {
				t.Fatalf("after SIGTERM: exit code %d, exited %v", code, ok)
			}
			said := warnedMessages(t, p.output(), tc.warn)
			if said == 0 {
				t.Fatalf("the cut work had published nothing: the test proves nothing")
			}
			if unique(v) >= total {
				t.Fatalf("the stop came after every message arrived: it proves nothing")
			}

			p.start()
			if err := v.WaitComplete(ctx); err != nil {
				t.Fatal(err)
			}
			testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
			if err := v.Check(validator.AtLeastOnce); err != nil {
				t.Fatal(err)
			}
			repeated := repeatedMessages(v)
			t.Logf("the relay said %d messages would be published again; %d were", said, repeated)
			if repeated > said {
				t.Errorf("%d messages arrived twice, the relay said %d would", repeated, said)
			}
			if code, _ := p.terminate(time.Minute); code != 0 {
				t.Errorf("SIGTERM at the end: exit code %d", code)
			}
		})
	}
}

// pauseWait is pause --wait in the tests that need the leader stopped: it
// finishes what it has in flight first, which on a busy machine has taken
// longer than the default 30 s.
var pauseWait = progress.Patience.String()

// warnedMessages is the "messages" field of the relay's log line with msg.
func warnedMessages(t *testing.T, out, msg string) int {
	t.Helper()
	line := grepLines(out, msg)
	if i := strings.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	var fields struct {
		Messages *int `json:"messages"`
	}
	j := strings.LastIndexByte(line, '\t')
	if j < 0 || json.Unmarshal([]byte(line[j+1:]), &fields) != nil || fields.Messages == nil {
		t.Fatalf("no messages count in the log line %q", line)
	}
	return *fields.Messages
}

// repeatedMessages is how many distinct messages v received more than once.
func repeatedMessages(v *validator.Validator) int {
	seen := map[string]int{}
	for _, d := range v.Deliveries() {
		seen[d.MessageId]++
	}
	n := 0
	for _, c := range seen {
		if c > 1 {
			n++
		}
	}
	return n
}

// brokerProxy puts a fault proxy in front of b and returns it with b's URL
// through it.
func brokerProxy(t *testing.T, b *testenv.Broker) (*testenv.FaultProxy, string) {
	t.Helper()
	u, err := amqp.ParseURI(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.Proxy(t, net.JoinHostPort(u.Host, strconv.Itoa(u.Port)))
	host, port, err := net.SplitHostPort(proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = host
	if u.Port, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	return proxy, u.String()
}

// pause of a relay whose leader stopped for the pause and then exited (no
// leader left in the row): it says the relay is paused with no leader
// running, instead of crashing on the missing leader.
func TestCLIPauseAgainAfterLeaderLeft(t *testing.T) {
	db := opsDB(t)
	opsExec(t, db, `INSERT INTO outbox_relay_progress (relay_name, status, epoch, paused_at, paused_epoch)
		VALUES ('default', 'PAUSED', 3, UTC_TIMESTAMP(6), 3)`)
	for _, args := range [][]string{{"pause"}, {"pause", "--json"}} {
		r := ops(t, db, args...)
		if r.code != 0 || strings.Contains(r.stderr, "panic") || !strings.Contains(r.stdout, "PAUSED") && !strings.Contains(r.stdout, "paused") {
			t.Errorf("%v: %+v", args, r)
		}
	}
}

// waitInflight waits until the relay holds messages the broker has not
// answered (outbox_relay_inflight_messages above 0).
func waitInflight(ctx context.Context, t *testing.T, base string) {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for metricValue(t, base, "outbox_relay_inflight_messages") == 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("no message in flight behind the stalled broker: %v", ctx.Err())
		case <-tick.C:
		}
	}
}
