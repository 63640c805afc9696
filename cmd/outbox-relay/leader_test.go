package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// Leadership flags of the failover tests: a short lease so a takeover
// comes within seconds, and a heartbeat well inside it.
const (
	testLease     = 5 * time.Second
	testHeartbeat = time.Second
)

func leaderFlags() []string {
	return []string{"--leader-lease", testLease.String(), "--heartbeat-interval", testHeartbeat.String()}
}

// stop and cont freeze and thaw the process (SIGSTOP, SIGCONT): a hung
// leader whose connections stay open.
func (p *relayProc) stop() { p.signal(syscall.SIGSTOP) }
func (p *relayProc) cont() { p.signal(syscall.SIGCONT) }

func (p *relayProc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("send %v to the relay: %v", sig, err)
	}
}

// epochDelivery is one delivery as the consumer saw it.
type epochDelivery struct {
	outboxID int64
	epoch    int64
	key      string // x-partition-key
	at       time.Time
}

// epochConsumer records every delivery's x-relay-epoch, x-outbox-id and
// arrival time: who published what, and when.
type epochConsumer struct {
	mu sync.Mutex
	ds []epochDelivery
}

func newEpochConsumer(t *testing.T, b *testenv.Broker) *epochConsumer {
	t.Helper()
	c := &epochConsumer{}
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(2000, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(b.DeclareQueue(t, "#"), "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range deliveries {
			epoch, _ := d.Headers["x-relay-epoch"].(int64)
			id, _ := d.Headers["x-outbox-id"].(int64)
			key, _ := d.Headers["x-partition-key"].(string)
			c.mu.Lock()
			c.ds = append(c.ds, epochDelivery{outboxID: id, epoch: epoch, key: key, at: time.Now()})
			c.mu.Unlock()
		}
	}()
	return c
}

// count is the number of deliveries for which f holds.
func (c *epochConsumer) count(f func(epochDelivery) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, d := range c.ds {
		if f(d) {
			n++
		}
	}
	return n
}

// keys is the set of partition keys of the deliveries for which f holds.
func (c *epochConsumer) keys(f func(epochDelivery) bool) map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := map[string]bool{}
	for _, d := range c.ds {
		if f(d) {
			keys[d.key] = true
		}
	}
	return keys
}

// first is the earliest delivery for which f holds.
func (c *epochConsumer) first(f func(epochDelivery) bool) (epochDelivery, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.ds {
		if f(d) {
			return d, true
		}
	}
	return epochDelivery{}, false
}

// last is the latest delivery for which f holds.
func (c *epochConsumer) last(f func(epochDelivery) bool) (epochDelivery, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.ds) - 1; i >= 0; i-- {
		if f(c.ds[i]) {
			return c.ds[i], true
		}
	}
	return epochDelivery{}, false
}

// waitFor waits until at least n deliveries satisfy f.
func (c *epochConsumer) waitFor(ctx context.Context, t *testing.T, what string, n int, f func(epochDelivery) bool) {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	for c.count(f) < n {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %d deliveries %s: %d so far: %v", n, what, c.count(f), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func ofEpoch(e int64) func(epochDelivery) bool {
	return func(d epochDelivery) bool { return d.epoch == e }
}

func afterEpoch(e int64) func(epochDelivery) bool {
	return func(d epochDelivery) bool { return d.epoch > e }
}

// failover is two relays of one name on one database, a producing stream,
// and the consumers that judge the result.
type failover struct {
	t        *testing.T
	ctx      context.Context
	db       *testenv.DB
	b        *testenv.Broker
	v        *validator.Validator
	seen     *epochConsumer
	leader   *relayProc
	standby  *relayProc
	stopProd atomic.Bool
	prodDone chan error
}

// startFailover starts the leader, then a standby, both with extra flags
// after the leadership ones (e.g. "--mode", "poll"), the leader with
// leaderOnly after those (a later flag wins: e.g. "--mysql-dsn" through a
// proxy), then a steady producing stream that runs until finish. Partition
// keys are each written by one producer, so commit order per key is known.
func startFailover(t *testing.T, ctx context.Context, db *testenv.DB, b *testenv.Broker, leaderOnly []string, extra ...string) *failover {
	t.Helper()
	f := &failover{t: t, ctx: ctx, db: db, b: b, prodDone: make(chan error, 1)}
	migrate(t, db.DSN)
	f.v = consumeAll(t, b)
	f.seen = newEpochConsumer(t, b)
	flags := append(leaderFlags(), extra...)
	f.leader = newRelayProc(t, append(relayArgs(t, db, b, flags...), leaderOnly...)...)
	f.leader.start()
	f.leader.waitLog(ctx, "leading")
	f.standby = newRelayProc(t, relayArgs(t, db, b, flags...)...)
	f.standby.start()
	f.standby.waitLog(ctx, "standby: another instance leads")
	go func() {
		// Rounds that each run to completion: every committed row is told
		// to the validator, and the stream lasts as long as the test.
		for !f.stopProd.Load() {
			if err := testload.Run(ctx, db.SQL, f.v, testload.Load{
				Producers: 4, Partitions: 40, Total: 400, Exchange: b.Exchange, Pace: 2 * time.Millisecond,
			}); err != nil {
				f.prodDone <- err
				return
			}
		}
		f.prodDone <- nil
	}()
	return f
}

// finish stops the stream and checks what users care about: every message
// arrived, first deliveries in commit order per partition key, properties
// right; duplicates are allowed (and returned).
func (f *failover) finish() int {
	t := f.t
	t.Helper()
	f.stopProd.Store(true)
	select {
	case err := <-f.prodDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-f.ctx.Done():
		t.Fatalf("producers did not finish: %v", f.ctx.Err())
	}
	if err := f.v.WaitComplete(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	return f.v.Duplicates()
}

// The leader is SIGKILLed under a producing stream: the standby takes over
// within the lease, nothing is lost, order per key holds.
func TestLeaderFailoverSIGKILL(t *testing.T) {
	t.Parallel() // a server of its own (privateDB); mostly waits for leases and exits
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	b := testenv.RabbitMQ(t)
	f := startFailover(t, ctx, db, b, nil)
	e1 := progressEpoch(ctx, t, db)
	f.seen.waitFor(ctx, t, "from the first leader", 500, ofEpoch(e1))

	f.leader.kill()
	killed := time.Now()
	// The bounded wait is the assertion: the standby leads within the lease
	// (plus slack for a loaded machine).
	wctx, cancel := context.WithTimeout(ctx, testLease+10*time.Second)
	f.standby.waitLog(wctx, "leading")
	cancel()
	f.seen.waitFor(ctx, t, "from the new leader", 200, afterEpoch(e1))
	first, _ := f.seen.first(afterEpoch(e1))
	dups := f.finish()
	t.Logf("SIGKILL: first delivery of the new leader %v after the kill; %d duplicates",
		first.at.Sub(killed).Round(time.Millisecond), dups)
}

// The leader is SIGSTOPped under a producing stream (its connections stay
// open, its lock stays held): the standby takes over once the lease has
// run out, and every partition moves again at once. Then the stale leader
// is woken: it publishes no row committed after it was stopped under its
// old epoch, moves nothing in the progress row, notices at once and
// becomes a standby.
func TestLeaderFailoverSIGSTOP(t *testing.T) { testLeaderFailoverSIGSTOP(t) }

// TestLeaderFailoverSIGSTOP in poll mode, the leader stopped inside a poll
// round that holds partition heads locked (stopInsideRound): the new leader
// must not find those partitions stuck behind the stopped process's row
// locks. A stale poll-mode leader that wakes claims no row and publishes none
// committed after it was stopped (each round checks the lease between its
// claim and its first publish).
func TestLeaderFailoverSIGSTOPPoll(t *testing.T) { testLeaderFailoverSIGSTOP(t, "--mode", "poll") }

// testLeaderFailoverSIGSTOP is TestLeaderFailoverSIGSTOP with extra relay
// flags; with "poll" among them the leader publishes through a proxy and is
// stopped inside a round (stopInsideRound).
func testLeaderFailoverSIGSTOP(t *testing.T, extra ...string) {
	t.Parallel() // a server of its own (privateDB); mostly waits for leases and exits
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	b := testenv.RabbitMQ(t)
	poll := slices.Contains(extra, "poll")
	var (
		leaderOnly []string
		amqpProxy  *testenv.FaultProxy
	)
	if poll {
		amqpURL, err := url.Parse(b.URL)
		if err != nil {
			t.Fatal(err)
		}
		amqpProxy = testenv.Proxy(t, amqpURL.Host)
		amqpURL.Host = amqpProxy.Addr()
		leaderOnly = []string{"--amqp-url", amqpURL.String()}
	}
	f := startFailover(t, ctx, db, b, leaderOnly, extra...)
	e1 := progressEpoch(ctx, t, db)
	f.seen.waitFor(ctx, t, "from the first leader", 500, ofEpoch(e1))
	keys := f.seen.keys(ofEpoch(e1))

	if poll {
		stopInsideRound(ctx, t, f.leader, amqpProxy, db.SQL, func() int { return f.seen.count(ofEpoch(e1)) })
	} else {
		f.leader.stop()
	}
	stopped := time.Now()
	// Every id from here on was allocated after the stop, so its row was
	// committed after it.
	var next int64
	if err := db.SQL.QueryRowContext(ctx, `SELECT AUTO_INCREMENT FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox'`).Scan(&next); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, testLease+10*time.Second)
	f.standby.waitLog(wctx, "took over")
	cancel()
	tookOver := time.Now()
	e2 := progressEpoch(ctx, t, db)
	waitEveryKey(ctx, t, f.seen, keys, e2, tookOver)
	everyKey := time.Now()
	// Rows committed after the stop are now in the stale leader's binlog
	// socket, waiting for it to read them (binlog mode), or pending rows
	// its poll workers would claim at their next round (poll mode).
	f.seen.waitFor(ctx, t, "from the new leader", 500, func(d epochDelivery) bool { return d.epoch == e2 && d.outboxID >= next })
	first, _ := f.seen.first(afterEpoch(e1))
	oldBefore := f.seen.count(ofEpoch(e1))

	f.leader.cont()
	woke := time.Now()
	f.leader.waitLog(ctx, "standby: another instance leads")
	if e := progressEpoch(ctx, t, db); e != e2 {
		t.Errorf("progress row at epoch %d after the stale leader woke, want %d (the new leader's)", e, e2)
	}
	dups := f.finish()
	late := f.seen.count(func(d epochDelivery) bool { return d.epoch == e1 && d.outboxID >= next })
	if late > 0 {
		t.Errorf("the stale leader published %d rows committed after it was stopped (ids >= %d) under epoch %d", late, next, e1)
	}
	afterWake := f.seen.count(ofEpoch(e1)) - oldBefore
	why := strings.TrimSpace(grepLines(f.leader.output(), "leadership"))
	ended := strings.TrimSpace(grepLines(f.standby.output(), "poll connections"))
	t.Logf("SIGSTOP %v: first delivery of the new leader %v after the stop, every one of %d keys %v after the takeover; "+
		"the stale leader published %d messages after waking (none committed after the stop), %d duplicates in all; "+
		"woke at +%v; the new leader's ending of its poll connections:\n%s\nits log:\n%s",
		extra, first.at.Sub(stopped).Round(time.Millisecond), len(keys), everyKey.Sub(tookOver).Round(time.Millisecond),
		afterWake, dups, woke.Sub(stopped).Round(time.Millisecond), ended, why)
}

// stopInsideRound SIGSTOPs a poll-mode leader while one of its rounds holds
// partition heads locked, as a leader stopped mid-round under a steady
// stream is. Its broker (through proxy) stalls, so a round that claims rows
// then waits for confirms that do not come. Once the server shows such a
// transaction (rows locked, none changed: a round before its
// acknowledgement) the leader is stopped, and the look is repeated while it
// is stopped: a transaction seen then can no longer end, as its frozen
// client sends no COMMIT. A round whose confirms came just before the stall
// may commit between the two looks; it then tries again. The proxy passes
// traffic again once the leader is stopped (its connections through it are
// cut).
func stopInsideRound(ctx context.Context, t *testing.T, p *relayProc, proxy *testenv.FaultProxy, db *sql.DB, delivered func() int) {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	defer proxy.Unstall()
	for {
		proxy.Stall()
		// A round that claims rows while the broker stalls holds them:
		// look for one for a while. None shows when the leader was not
		// polling at the stall (between reconnects, or its AMQP heartbeat
		// gave the stalled link up first on a busy machine): then let it
		// through again until it delivers, and stall anew.
		looked := time.Now()
		for roundsHolding(ctx, t, db) == 0 && time.Since(looked) < holdingLook {
			select {
			case <-ctx.Done():
				t.Fatalf("no poll round of the leader holds rows locked while its broker stalls: %v", ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
		if roundsHolding(ctx, t, db) > 0 {
			p.stop()
			p.waitStopped(ctx)
			if roundsHolding(ctx, t, db) > 0 {
				return
			}
			p.cont()
		}
		proxy.Unstall()
		before := delivered()
		for delivered() == before {
			select {
			case <-ctx.Done():
				t.Fatalf("the leader delivered nothing after its broker link was let through again: %v", ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// holdingLook is how long stopInsideRound looks for a round holding rows
// after it stalls the broker before it tries again: rounds start within
// milliseconds while rows are pending, so a miss means the leader was not
// polling at the stall, not that it is slow.
const holdingLook = 5 * time.Second

// roundsHolding counts the transactions that hold rows locked and have
// changed none: poll rounds between their claim and their acknowledgement
// (the producers' transactions change rows; the standby runs none).
func roundsHolding(ctx context.Context, t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.INNODB_TRX
		WHERE trx_rows_locked > 0 AND trx_rows_modified = 0`).Scan(&n); err != nil {
		t.Fatalf("look for poll rounds holding rows: %v", err)
	}
	return n
}

// waitStopped waits until the kernel shows the process stopped (state T
// in /proc/PID/stat): SIGSTOP has taken effect on every thread.
func (p *relayProc) waitStopped(ctx context.Context) {
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	p.t.Helper()
	path := fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid)
	for {
		data, err := os.ReadFile(path)
		if err != nil {
			p.t.Fatalf("read the relay's state: %v", err)
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		if rest := string(data[bytes.LastIndexByte(data, ')')+1:]); strings.HasPrefix(strings.TrimSpace(rest), "T") {
			return
		}
		select {
		case <-ctx.Done():
			p.t.Fatalf("the relay did not stop after SIGSTOP: %v", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitEveryKey waits until the leader of epoch e has delivered rows of
// every one of keys. It fails when no further key has moved for
// progress.Patience: a key that never moves is a partition whose head stays
// locked, typically by the stale leader's stopped poll round (which, without
// the takeover ending its connections, holds it until the stale process
// wakes or the server drops it: hours). tookOver dates the log line.
func waitEveryKey(ctx context.Context, t *testing.T, c *epochConsumer, keys map[string]bool, e int64, tookOver time.Time) {
	t.Helper()
	var missing []string
	moved := func() int64 {
		got := c.keys(ofEpoch(e))
		missing = missing[:0]
		for k := range keys {
			if !got[k] {
				missing = append(missing, k)
			}
		}
		return int64(len(keys) - len(missing))
	}
	err := progress.Wait(ctx, "wait for every partition key from the new leader", moved, func() bool { return len(missing) == 0 })
	if err != nil {
		slices.Sort(missing)
		t.Fatalf("%v after the takeover the new leader (epoch %d) has delivered rows of %d of %d partition keys; "+
			"%d have not moved (their heads are locked, e.g. by the stopped leader's poll round): %q: %v",
			time.Since(tookOver).Round(time.Millisecond), e, len(keys)-len(missing), len(keys), len(missing), missing, err)
	}
	t.Logf("every partition key moved %v after the takeover", time.Since(tookOver).Round(time.Millisecond))
}

// The leader's database connections go through a proxy that is cut and
// then refuses connections: it stops publishing at once (it loses its lock
// connection), the standby takes over, nothing is lost.
func TestLeaderLosesLockConnection(t *testing.T) {
	t.Parallel() // a server of its own (privateDB); mostly waits for leases and exits
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	b := testenv.RabbitMQ(t)
	proxy := testenv.Proxy(t, db.Host+":"+strconv.Itoa(db.Port))
	dsn := strings.Replace(db.DSN, fmt.Sprintf("tcp(%s:%d)", db.Host, db.Port), "tcp("+proxy.Addr()+")", 1)
	if dsn == db.DSN {
		t.Fatalf("cannot route DSN %q through the proxy", db.DSN)
	}
	f := startFailover(t, ctx, db, b, []string{"--mysql-dsn", dsn})
	e1 := progressEpoch(ctx, t, db)
	f.seen.waitFor(ctx, t, "from the first leader", 500, ofEpoch(e1))

	proxy.Disable()
	cut := time.Now()
	f.leader.waitLog(ctx, "leadership")
	noticed := time.Now()
	wctx, cancel := context.WithTimeout(ctx, testLease+10*time.Second)
	f.standby.waitLog(wctx, "leading")
	cancel()
	f.seen.waitFor(ctx, t, "from the new leader", 200, afterEpoch(e1))
	first, _ := f.seen.first(afterEpoch(e1))
	last, _ := f.seen.last(ofEpoch(e1))
	proxy.Enable()
	f.leader.waitLog(ctx, "standby: another instance leads")
	dups := f.finish()
	t.Logf("lock connection cut: the leader logged the loss %v after the cut, its last delivery arrived %v after it; "+
		"first delivery of the new leader %v after it; %d duplicates",
		noticed.Sub(cut).Round(time.Millisecond), last.at.Sub(cut).Round(time.Millisecond),
		first.at.Sub(cut).Round(time.Millisecond), dups)
}

// The leader is SIGSTOPped under a producing stream and its lock connection
// alone is killed (as a proxy's idle timeout, a DBA's KILL or wait_timeout
// would): the lock is free while the leader's lease still runs. It is woken
// inside that lease holding rows it read before the stop: its broker is
// slow (a proxy with latency, a small confirm window), so its lanes wait in
// Publish with rows that passed the lease check. No message of its epoch
// may arrive after the first of the new leader's (which therefore must not
// publish before the old lease has run out), and nothing is lost.
func TestLeaderFailoverLockKilledWhileStopped(t *testing.T) {
	t.Parallel() // a server of its own (privateDB); mostly waits for leases and exits
	// A longer lease than the other failover tests: the old leader is woken
	// well inside it, after a standby had time to take the free lock.
	const lease = 10 * time.Second
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	b := testenv.RabbitMQ(t)
	amqpURL, err := url.Parse(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.Proxy(t, amqpURL.Host)
	amqpURL.Host = proxy.Addr()
	f := startFailover(t, ctx, db, b, []string{"--amqp-url", amqpURL.String(), "--confirm-window", "4", "--lanes", "8"},
		"--leader-lease", lease.String())
	e1 := progressEpoch(ctx, t, db)
	f.leader.waitLog(ctx, "tailing the binlog")
	f.seen.waitFor(ctx, t, "from the first leader", 500, ofEpoch(e1))
	// The broker slows down for the leader: it falls behind the stream, its
	// lanes wait for confirms with the next rows in hand.
	proxy.SetLatency(100 * time.Millisecond)
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) >= 1000 FROM outbox", 1)

	f.leader.stop()
	stopped := time.Now()
	var (
		holder int64
		ageUS  int64
	)
	if err := db.SQL.QueryRowContext(ctx, `SELECT IS_USED_LOCK('outbox-relay:default'),
		TIMESTAMPDIFF(MICROSECOND, leader_heartbeat, NOW(6)) FROM outbox_relay_progress WHERE relay_name = 'default'`).
		Scan(&holder, &ageUS); err != nil {
		t.Fatalf("find the leader's lock connection: %v", err)
	}
	if _, err := db.SQL.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", holder)); err != nil {
		t.Fatalf("kill the leader's lock connection %d: %v", holder, err)
	}
	// The old leader's own lease ends at 9/10 of the lease after it sent its
	// last heartbeat, which the server stored at most ageUS before the stop.
	oldLeaseEnd := stopped.Add(lease*9/10 - time.Duration(ageUS)*time.Microsecond)

	// A standby takes the free lock and bumps the epoch.
	step, cancel := progress.Step(ctx)
	defer cancel()
	for progressEpoch(ctx, t, db) == e1 {
		select {
		case <-step.Done():
			t.Fatalf("no standby took the free lock: %v", step.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	// Wake the old leader once the new one has published, or halfway
	// through what is left of the old lease, whichever comes first.
	wakeBy := stopped.Add(oldLeaseEnd.Sub(stopped) / 2)
	for {
		if _, ok := f.seen.first(afterEpoch(e1)); ok || !time.Now().Before(wakeBy) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	oldBefore := f.seen.count(ofEpoch(e1))
	f.leader.cont()
	woke := time.Now()
	if !woke.Before(oldLeaseEnd) {
		t.Fatalf("woke the old leader %v after the stop, past its lease (%v after the stop): the test proves nothing",
			woke.Sub(stopped).Round(time.Millisecond), oldLeaseEnd.Sub(stopped).Round(time.Millisecond))
	}
	f.leader.waitLog(ctx, "standby: another instance leads")
	f.seen.waitFor(ctx, t, "from the new leader", 200, afterEpoch(e1))
	dups := f.finish()

	first, _ := f.seen.first(afterEpoch(e1))
	if late := lateInOrder(f.seen, e1); late > 0 {
		last, _ := f.seen.last(ofEpoch(e1))
		t.Errorf("%d messages of the old leader's epoch %d arrived after the new leader's first (the last %v after it): "+
			"the new leader published inside the old leader's lease", late, e1, last.at.Sub(first.at).Round(time.Millisecond))
	}
	// The wait is said once, before the new leader leads.
	waited := grepLines(f.standby.output(), "lease runs until")
	if strings.Count(waited, "\n") != 1 {
		t.Errorf("the new leader logged its wait for the old lease %d times, want once:\n%s", strings.Count(waited, "\n"), waited)
	}
	why := strings.TrimSpace(grepLines(f.leader.output(), "leadership"))
	t.Logf("lock killed while stopped: woke the old leader at +%v (its lease ran to +%v); it published %d messages after waking; "+
		"first delivery of the new leader at +%v; %d duplicates; the new leader's wait:\n%sthe old leader's log:\n%s",
		woke.Sub(stopped).Round(time.Millisecond), oldLeaseEnd.Sub(stopped).Round(time.Millisecond),
		f.seen.count(ofEpoch(e1))-oldBefore, first.at.Sub(stopped).Round(time.Millisecond), dups, waited, why)
}

// lateInOrder is the number of deliveries of epoch old that arrived after the
// first delivery of a later epoch, in the consumer's arrival order.
func lateInOrder(c *epochConsumer, old int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, newer := 0, false
	for _, d := range c.ds {
		newer = newer || d.epoch > old
		if newer && d.epoch == old {
			n++
		}
	}
	return n
}
