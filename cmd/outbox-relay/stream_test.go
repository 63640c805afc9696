package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/streams"
)

// testStreams declares a super stream of n partitions unique to the test on
// b's broker, deleted at cleanup, and returns its destination config.
func testStreams(t *testing.T, b *testenv.Broker, n int) streams.Config {
	t.Helper()
	u, err := streams.FromAMQP(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	return testStreamsAt(t, u, n)
}

// testStreamsAt is testStreams on the broker whose stream URL is u (a
// private node's StreamURL).
func testStreamsAt(t *testing.T, u string, n int) streams.Config {
	t.Helper()
	cfg := streams.Config{Stream: fmt.Sprintf("test-%s-%d", t.Name(), time.Now().UnixNano()), Partitions: n,
		URL: u, Producer: "default", Window: 100}
	pub, err := streams.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if _, err := pub.Declare(); err != nil {
		t.Fatal(err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = cfg.PartitionName(i)
	}
	testenv.DeleteStreamsAtCleanup(t, u, names...)
	return cfg
}

// waitAcknowledged waits until the relay has acknowledged n rows (committed
// by the producers and gone from the outbox) and returns how many; the relay
// must keep running meanwhile.
func waitAcknowledged(ctx context.Context, t *testing.T, db *testenv.DB, v *validator.Validator, p *relayProc, n int) int {
	t.Helper()
	acked := func() int { return v.ExpectedCount() - outboxRows(ctx, t, db) }
	// Progress is a new highest count: while producers write, the two
	// reads race and the difference flickers even when the relay is stuck.
	best := int64(-1)
	err := progress.Wait(ctx, "wait for acknowledged rows", func() int64 {
		best = max(best, int64(acked()))
		return best
	}, func() bool {
		return !p.running() || acked() >= n
	})
	if !p.running() {
		t.Fatalf("relay exited by itself (code %d)", p.cmd.ProcessState.ExitCode())
	}
	if err != nil {
		t.Fatal(err)
	}
	return acked()
}

// streamSetup is a stream test's fixtures: its work context, a migrated
// database on a server of its own, the broker, a super stream of parts
// partitions and a validator reading it.
func streamSetup(t *testing.T, parts int) (context.Context, *testenv.DB, *testenv.Broker, streams.Config, *validator.Validator) {
	t.Helper()
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	sc := testStreams(t, b, parts)
	return ctx, db, b, sc, consumeStreams(t, sc)
}

// consumeStreams attaches a validator to every partition of cfg.
func consumeStreams(t *testing.T, cfg streams.Config) *validator.Validator {
	t.Helper()
	v := validator.New()
	names := make([]string, cfg.Partitions)
	for i := range names {
		names[i] = cfg.PartitionName(i)
	}
	stop, err := validator.ConsumeStreams(cfg.URL, names, v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return v
}

// 30,000 messages over 100 keys into 4 partition streams while the relay is
// SIGKILLed 4 times mid-publish and restarted: every message is in the
// streams exactly once (0 duplicates: the restarts re-publish the
// unacknowledged tails with the same publishing ids, which the broker
// drops), with every property of the AMQP message, in commit order per key.
func TestRunStreamSurvivesSIGKILLExactlyOnce(t *testing.T) {
	const total, kills, parts = 30_000, 4, 4
	heavy(t)
	ctx, db, b, sc, v := streamSetup(t, parts)
	relay := newRelayProc(t, relayArgs(t, db, b, append(leaderFlags(), "--mode", "binlog",
		"--stream", sc.Stream, "--stream-partitions", fmt.Sprint(parts))...)...)
	relay.start()
	// The first start, with nothing pending, hands over to the binlog at
	// once; the kills then hit terms that resume from the stored position
	// and publishing ids.
	relay.waitLog(ctx, "tailing the binlog")
	began := time.Now()

	// The producers write about 1,500 rows a second, so the stream lasts
	// through the kills and each kill lands while rows arrive and are
	// published (a burst would be acknowledged before the later kills).
	prodDone := crashLoad(ctx, db, v, b, total, 25*time.Millisecond)
	// Kill thresholds: rows the relay has acknowledged (the consumer of the
	// streams lags, so the relay's own progress decides); each kill waits a
	// further 0-100 ms so it lands at an arbitrary point of publishing.
	thresholds := killThresholds(total, kills)
	floor := 0 // what the previous terms acknowledged: this one must add to it
	for i, th := range thresholds {
		at := waitAcknowledged(ctx, t, db, v, relay, max(th, floor+200))
		time.Sleep(time.Duration(testload.RandN(100)) * time.Millisecond)
		relay.kill()
		left := outboxRows(ctx, t, db)
		if left == 0 && v.ExpectedCount() >= total {
			t.Fatalf("kill %d came after every row was acknowledged: it proved nothing", i+1)
		}
		t.Logf("SIGKILL %d at %d acknowledged rows (threshold %d), %d rows in the outbox", i+1, at, th, left)
		floor = v.ExpectedCount() - left
		relay.start()
	}
	finishLoad(ctx, t, prodDone, v)
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	t.Logf("%d messages through %d SIGKILLs in %v: %d duplicates in the streams",
		total, kills, time.Since(began).Round(time.Millisecond), v.Duplicates())
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	// The kills left tails that were published again (and dropped by the
	// broker): otherwise the test proved nothing about deduplication.
	repeats := repeats(relay)
	t.Logf("messages published again after the kills, dropped by the broker: %d", repeats)
	if repeats == 0 {
		t.Error("no restart published anything again: the kills did not land while messages were unacknowledged")
	}
	if code, took := relay.terminate(progress.Patience); code != 0 { // one step: the exit, however slow the machine
		t.Fatalf("SIGTERM at the end: exit code %d after %v", code, took)
	}
}

// A leader frozen (SIGSTOP) while it publishes into the streams is replaced
// by its standby, which resumes from the stored position and ids, then
// wakes with its in-flight messages: the new leader re-publishes the
// frozen one's unacknowledged tail with the same publishing ids, so the
// streams hold every message once (0 duplicates), in order per key.
func TestLeaderFailoverSIGSTOPStream(t *testing.T) {
	t.Parallel() // a server of its own (privateDB); mostly waits for the lease
	ctx, db, b, sc, v := streamSetup(t, 4)
	flags := append(leaderFlags(), "--mode", "binlog", "--stream", sc.Stream, "--stream-partitions", "4")
	leader := newRelayProc(t, relayArgs(t, db, b, flags...)...)
	leader.start()
	leader.waitLog(ctx, "tailing the binlog")
	standby := newRelayProc(t, relayArgs(t, db, b, flags...)...)
	standby.start()
	standby.waitLog(ctx, "standby: another instance leads")

	var stopProd atomic.Bool
	prodDone := make(chan error, 1)
	go func() {
		for !stopProd.Load() {
			if err := testload.Run(ctx, db.SQL, v, testload.Load{
				Producers: 4, Partitions: 40, Total: 400, Exchange: b.Exchange, Pace: 2 * time.Millisecond,
			}); err != nil {
				prodDone <- err
				return
			}
		}
		prodDone <- nil
	}()
	acked := waitAcknowledged(ctx, t, db, v, leader, 500)
	leader.stop()
	wctx, cancel := context.WithTimeout(ctx, testLease+10*time.Second)
	standby.waitLog(wctx, "took over")
	cancel()
	waitAcknowledged(ctx, t, db, v, standby, acked+500)
	leader.cont()
	leader.waitLog(ctx, "standby: another instance leads")
	stopProd.Store(true)
	if err := <-prodDone; err != nil {
		t.Fatal(err)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	t.Logf("%d messages, %d duplicates in the streams; the new leader: %s", v.ExpectedCount(), v.Duplicates(),
		strings.TrimSpace(grepLines(standby.output(), "continuing the stored publishing ids")))
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
}

// The stream connection is cut three times while the relay publishes (a
// broker restart or a network fault as the relay sees it): each cut fails
// the producers, the term restarts from the stored position and ids in the
// same process, and the streams hold every message once (0 duplicates).
func TestRunStreamConnectionCutExactlyOnce(t *testing.T) {
	const total, cuts = 6_000, 3
	heavy(t)
	ctx, db, b, sc, v := streamSetup(t, 4)
	u, err := url.Parse(sc.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.Proxy(t, u.Host)
	u.Host = proxy.Addr()
	relay := newRelayProc(t, relayArgs(t, db, b, append(leaderFlags(), "--mode", "binlog", "--stream", sc.Stream,
		"--stream-partitions", "4", "--stream-url", u.String())...)...)
	relay.start()
	relay.waitLog(ctx, "tailing the binlog")
	prodDone := crashLoad(ctx, db, v, b, total, 20*time.Millisecond)
	floor := 0
	for i, th := range killThresholds(total, cuts) {
		at := waitAcknowledged(ctx, t, db, v, relay, max(th, floor+200))
		time.Sleep(time.Duration(testload.RandN(50)) * time.Millisecond)
		proxy.Cut()
		left := outboxRows(ctx, t, db)
		t.Logf("cut %d at %d acknowledged rows, %d rows in the outbox", i+1, at, left)
		floor = v.ExpectedCount() - left
	}
	finishLoad(ctx, t, prodDone, v)
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	t.Logf("%d messages through %d cuts: %d duplicates in the streams, %d published again and dropped by the broker",
		total, cuts, v.Duplicates(), repeats(relay))
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	if !relay.running() {
		t.Fatal("the relay exited")
	}
}

// The relay publishes a paced load into 4 partition streams on a private
// RabbitMQ node, and the node is restarted twice mid-publish: first a clean
// stop and start, then a SIGKILL and start (a crash: no clean shutdown).
// Each restart comes while the broker holds at least 20 messages above the
// publishing ids stored with the checkpoint (asked of the broker,
// query_publisher_sequence, just before): published, not yet acknowledged,
// which the next term publishes again and the broker drops; the wait for
// that tail is the test's proof that the restart came while messages were
// unacknowledged. Whether the next term finds the tail still above the
// stored ids is up to the race between the restart and the relay: a relay
// that had the tail's confirms acknowledges them after the node went away
// (seen after kills, and after a stop on a loaded machine), and a tail the
// broker had not committed may be gone after a kill; the terms' repeats are
// logged, not required. Either way the count below holds.
// The relay is not restarted: by design a lost stream connection ends the
// term and the same process starts the next one from the stored position and
// ids, dialing --stream-url until the node is back; it must keep running.
// The streams then hold every message exactly once (0 duplicates), in
// commit order per key.
//
// The validator reads the streams after the fact, from their first offsets
// to an end marker (validator.ReadStreams): a live stream consumer ends with
// the node and does not reconnect, so it could not count soundly across the
// restarts. The relay's own progress (rows acknowledged) paces the
// restarts.
func TestRunStreamNodeRestartExactlyOnce(t *testing.T) {
	// minTail: the restarts wait for a burst on the broker, not a message
	// or two that the relay acknowledges within the millisecond.
	const minTotal, parts, minTail = 2000, 4, 20
	t.Parallel() // a server and a node of its own; a paced load, mostly waits
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	migrate(t, db.DSN)
	node := testenv.StartRabbitMQ(t, testenv.RabbitStreams())
	b := node.Broker(t)
	sc := testStreamsAt(t, node.StreamURL(), parts)
	v := validator.New()
	relay := newRelayProc(t, relayArgs(t, db, b, append(leaderFlags(), "--mode", "binlog", "--stream", sc.Stream,
		"--stream-partitions", fmt.Sprint(parts), "--stream-url", sc.URL)...)...)
	relay.start()
	relay.waitLog(ctx, "tailing the binlog")
	began := time.Now()

	// About 130 rows a second (4 producers, 150 ms apart, 2% of the
	// transactions of 200 rows), at least minTotal and on until the relay
	// has resumed after the second restart: rows keep arriving through both
	// restarts, however slow the machine (a restart has taken 15 s beside
	// other tests), and the workload stays a few thousand messages. The
	// large transactions make bursts the relay takes a while to publish
	// and acknowledge: the restarts aim at those.
	until := make(chan struct{})
	prodDone := make(chan error, 1)
	go func() {
		prodDone <- testload.Run(ctx, db.SQL, v, testload.Load{
			Producers: 4, Partitions: 40, Total: minTotal, BigTxn: 200, BigShare: 0.02,
			Exchange: b.Exchange, Pace: 150 * time.Millisecond, Until: until,
		})
	}()
	restarts := []struct {
		name string
		down func(testing.TB)
	}{{"stop", node.Stop}, {"kill", node.Kill}}
	floor := 0 // rows acknowledged after the previous restart
	for i, r := range restarts {
		at := waitAcknowledged(ctx, t, db, v, relay, floor+500)
		// The restart comes while the broker holds messages above the ids
		// stored with the checkpoint (published, not yet acknowledged: the
		// bursts), which the next term publishes again.
		env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(sc.URL))
		if err != nil {
			t.Fatal(err)
		}
		tail, left := 0, 0
		mark := len(relay.output())
		err = progress.Wait(ctx, "wait for messages on the broker not yet acknowledged", func() int64 { return int64(v.ExpectedCount()) },
			func() bool {
				left = outboxRows(ctx, t, db)
				tail = tailOnBroker(ctx, t, db, env, sc)
				return tail >= minTail || !relay.running()
			})
		if err != nil {
			t.Fatal(err)
		}
		if !relay.running() {
			t.Fatalf("relay exited by itself (code %d)", relay.cmd.ProcessState.ExitCode())
		}
		// At once: the relay acknowledges a burst within milliseconds.
		down := time.Now()
		r.down(t)
		_ = env.Close() // its connection died with the node
		node.Start(t)
		back := time.Since(down)
		// The relay resumes on the restarted node and goes on acknowledging.
		floor = waitAcknowledged(ctx, t, db, v, relay, v.ExpectedCount()-outboxRows(ctx, t, db)+200)
		t.Logf("restart %d (%s + start) at %d acknowledged rows, %d rows in the outbox, %d messages on the broker above the stored ids; "+
			"node back in %v, relay acknowledging again after %v; the terms since published %d messages again",
			i+1, r.name, at, left, tail, back.Round(time.Millisecond), time.Since(down).Round(time.Millisecond),
			repeatsIn(relay.output()[mark:]))
	}
	close(until)
	if err := <-prodDone; err != nil {
		t.Fatal(err)
	}
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	if !relay.running() {
		t.Fatalf("the relay exited (code %d)", relay.cmd.ProcessState.ExitCode())
	}
	if code, took := relay.terminate(progress.Patience); code != 0 { // one step: the exit, however slow the machine
		t.Fatalf("SIGTERM at the end: exit code %d after %v", code, took)
	}
	names := make([]string, parts)
	for i := range names {
		names[i] = sc.PartitionName(i)
	}
	if err := validator.ReadStreams(ctx, sc.URL, names, v); err != nil {
		t.Fatal(err)
	}
	repeats := repeats(relay)
	t.Logf("%d messages through %d node restarts in %v: %d in the streams, %d duplicates; %d published again and dropped by the broker",
		v.ExpectedCount(), len(restarts), time.Since(began).Round(time.Millisecond), v.Received(), v.Duplicates(), repeats)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
}

// tailOnBroker is how many messages the broker holds above the publishing
// ids stored with the relay's checkpoint (relay name "default", producers
// default-<i>): published and not yet acknowledged. 0 while no ids are
// stored.
func tailOnBroker(ctx context.Context, t *testing.T, db *testenv.DB, env *stream.Environment, sc streams.Config) int {
	t.Helper()
	var raw sql.NullString
	if err := db.SQL.QueryRowContext(ctx, "SELECT stream_ids FROM outbox_relay_progress WHERE relay_name = 'default'").Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var stored struct{ IDs []int64 }
	if !raw.Valid || json.Unmarshal([]byte(raw.String), &stored) != nil || len(stored.IDs) != sc.Partitions {
		return 0
	}
	n := 0
	for i, id := range stored.IDs {
		last, err := env.QuerySequence(fmt.Sprintf("default-%d", i), sc.PartitionName(i))
		if err != nil {
			t.Fatalf("query the broker's last publishing id of default-%d: %v", i, err)
		}
		n += int(max(0, last-id))
	}
	return n
}

// repeats sums what the relay's terms published again after resuming
// (each start logs the count the broker holds above the stored ids).
func repeats(p *relayProc) int { return repeatsIn(p.output()) }

// repeatsIn is repeats over a part of the relay's output.
func repeatsIn(out string) int {
	n := 0
	for _, m := range regexp.MustCompile(`"repeats": (\d+)`).FindAllStringSubmatch(out, -1) {
		k, _ := strconv.Atoi(m[1])
		n += k
	}
	return n
}
