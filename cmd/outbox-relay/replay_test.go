package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// splitConsumer reads the test's queue: live deliveries go to a validator,
// replayed ones (x-replay: true) to a list.
type splitConsumer struct {
	live *validator.Validator
	mu   sync.Mutex
	rep  []amqp.Delivery
}

func newSplitConsumer(t *testing.T, b *testenv.Broker) *splitConsumer {
	t.Helper()
	c := &splitConsumer{live: validator.New()}
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(b.Queue, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			if r, _ := d.Headers["x-replay"].(bool); r {
				c.mu.Lock()
				c.rep = append(c.rep, d)
				c.mu.Unlock()
				continue
			}
			c.live.Observe(d)
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return c
}

func (c *splitConsumer) replayed() []amqp.Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]amqp.Delivery(nil), c.rep...)
}

// committed is a message the test wrote, in commit order.
type committed struct {
	id  outbox.MessageID
	msg outbox.Message
}

// writeTxns commits n transactions of 1 to 4 messages over the partition
// keys k0..k5 and the empty key, and tells v.
func writeTxns(ctx context.Context, t *testing.T, db *testenv.DB, v *validator.Validator, exchange, tag string, n int) []committed {
	t.Helper()
	var out []committed
	for i := range n {
		msgs := make([]outbox.Message, 1+i%4)
		for j := range msgs {
			key := fmt.Sprintf("k%d", (i+j)%7)
			if key == "k6" {
				key = ""
			}
			msgs[j] = outbox.Message{
				PartitionKey: key, RoutingKey: "rk." + tag, MessageType: "test." + tag,
				Payload: fmt.Appendf(nil, `{"txn":%d,"row":%d}`, i, j), Headers: map[string]any{"tag": tag},
			}
		}
		tx, err := db.SQL.BeginTx(ctx, nil)
		if err != nil {
			t.Error(err)
			return out
		}
		ids, err := outbox.Enqueue(ctx, tx, msgs...)
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			_ = tx.Rollback()
			t.Errorf("write %s: %v", tag, err)
			return out
		}
		for j, m := range msgs {
			out = append(out, committed{ids[j], m})
			v.Expect(validator.Expected{
				ID: ids[j], PartitionKey: m.PartitionKey, Exchange: exchange, RoutingKey: m.RoutingKey,
				MessageType: m.MessageType, Payload: m.Payload, Headers: m.Headers,
			})
		}
	}
	return out
}

func binlogPos(ctx context.Context, t *testing.T, db *testenv.DB) string {
	t.Helper()
	var pos string
	if err := db.SQL.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	return pos
}

// The relay runs. A replay of a GTID range republishes exactly the messages
// the range inserted, once each, in commit order per partition key, each the
// original plus x-replay: true, while the relay keeps delivering the rows
// written meanwhile exactly once, its binlog connection never interrupted
// (the replay reads with its own server id). A dry run with filters counts
// and publishes nothing; a reversed range is refused with exit code 2.
func TestReplayWhileRelayRuns(t *testing.T) {
	ctx := testenv.WorkContext(t)
	db := testenv.MySQL(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	c := newSplitConsumer(t, b)
	relay := newRelayProc(t, relayArgs(t, db, b)...)
	relay.start()
	relay.waitLog(ctx, "tailing the binlog")

	from := binlogPos(ctx, t, db)
	rangeMsgs := writeTxns(ctx, t, db, c.live, b.Exchange, "range", 80)
	to := binlogPos(ctx, t, db)
	if err := c.live.WaitComplete(ctx); err != nil {
		t.Fatalf("the relay did not deliver the range: %v", err)
	}

	// More rows while the replay runs: the relay keeps delivering.
	var later sync.WaitGroup
	later.Add(1)
	go func() {
		defer later.Done()
		for range 40 {
			writeTxns(ctx, t, db, c.live, b.Exchange, "later", 3)
			time.Sleep(5 * time.Millisecond) // a steady stream during the replay, not a burst
		}
	}()

	r := runBinary(t, relayBinary(t), nil, "replay", "--mysql-dsn", db.DSN, "--amqp-url", b.URL,
		"--default-exchange", b.Exchange, "--from-gtid", from, "--to-gtid", to, "--json", "--log-format", "console")
	later.Wait()
	if r.code != 0 {
		t.Fatalf("replay: %+v", r)
	}
	var sum struct {
		Messages, Confirmed int
		From, To            string
	}
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil {
		t.Fatalf("replay --json output %q: %v", r.stdout, err)
	}
	if sum.Messages != len(rangeMsgs) || sum.Confirmed != len(rangeMsgs) || sum.From != from || sum.To != to {
		t.Fatalf("replay summary %+v; want %d messages confirmed, from %s to %s", sum, len(rangeMsgs), from, to)
	}

	// Everything the replay published is confirmed, so in the queue; the
	// consumer gets it within seconds.
	replayed := func() int64 { return int64(len(c.replayed())) }
	if err := progress.Wait(ctx, "wait for the replayed deliveries", replayed, func() bool { return len(c.replayed()) >= len(rangeMsgs) }); err != nil {
		t.Fatalf("%d replayed deliveries, want %d: %v", len(c.replayed()), len(rangeMsgs), err)
	}
	checkReplayedCLI(t, c.replayed(), rangeMsgs, b.Exchange)

	if err := c.live.WaitComplete(ctx); err != nil {
		t.Fatalf("the relay stopped delivering during the replay: %v", err)
	}
	if err := c.live.Check(validator.ExactlyOnce); err != nil {
		t.Fatalf("live deliveries: %v", err)
	}
	if !relay.running() || strings.Contains(relay.output(), "binlog stream interrupted") {
		t.Fatalf("the relay was disturbed by the replay (running %v):\n%s", relay.running(), grepLines(relay.output(), "interrupted"))
	}

	// A dry run with repeated --partition-key: counts, publishes nothing.
	want := 0
	for _, m := range rangeMsgs {
		if m.msg.PartitionKey == "k1" || m.msg.PartitionKey == "k2" {
			want++
		}
	}
	r = runBinary(t, relayBinary(t), nil, "replay", "--mysql-dsn", db.DSN, "--amqp-url", b.URL,
		"--default-exchange", b.Exchange, "--from-gtid", from, "--to-gtid", to, "--dry-run",
		"--partition-key", "k1", "--partition-key", "k2")
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("dry run: %d messages would be replayed", want)) ||
		!regexp.MustCompile(fmt.Sprintf(`(?m)^%s\s+rk\.range\s+%d$`, regexp.QuoteMeta(b.Exchange), want)).MatchString(r.stdout) {
		t.Fatalf("dry run: %+v; want %d messages", r, want)
	}

	r = runBinary(t, relayBinary(t), nil, "replay", "--mysql-dsn", db.DSN, "--amqp-url", b.URL,
		"--from-gtid", to, "--to-gtid", from)
	if r.code != 2 || !strings.Contains(r.stderr, "the range is empty") {
		t.Fatalf("reversed range: %+v; want exit 2 saying the range is empty", r)
	}
	if n := len(c.replayed()); n != len(rangeMsgs) {
		t.Fatalf("%d replayed deliveries after the dry run, want %d", n, len(rangeMsgs))
	}
	if code, took := relay.terminate(time.Minute); code != 0 {
		t.Fatalf("relay exit code %d after %v", code, took)
	}
}

// checkReplayedCLI asserts that got are exactly want, once each, in want's
// order per partition key, each the original message plus x-replay: true.
func checkReplayedCLI(t *testing.T, got []amqp.Delivery, want []committed, exchange string) {
	t.Helper()
	byID := map[string]outbox.Message{}
	order := map[string][]string{}
	for _, w := range want {
		byID[w.id.String()] = w.msg
		if w.msg.PartitionKey != "" {
			order[w.msg.PartitionKey] = append(order[w.msg.PartitionKey], w.id.String())
		}
	}
	var problems []string
	seen := map[string]bool{}
	gotOrder := map[string][]string{}
	for _, d := range got {
		m, ok := byID[d.MessageId]
		switch {
		case !ok:
			problems = append(problems, "unexpected replayed message "+d.MessageId)
			continue
		case seen[d.MessageId]:
			problems = append(problems, "replayed twice: "+d.MessageId)
		}
		seen[d.MessageId] = true
		if m.PartitionKey != "" {
			gotOrder[m.PartitionKey] = append(gotOrder[m.PartitionKey], d.MessageId)
		}
		pk, _ := d.Headers["x-partition-key"].(string)
		_, hasID := d.Headers["x-outbox-id"].(int64)
		if d.Exchange != exchange || d.RoutingKey != m.RoutingKey || d.Type != m.MessageType || string(d.Body) != string(m.Payload) ||
			d.Headers["tag"] != m.Headers["tag"] || pk != m.PartitionKey || !hasID || d.DeliveryMode != amqp.Persistent {
			problems = append(problems, fmt.Sprintf("%s differs from its row: %s/%s type %q body %q headers %v",
				d.MessageId, d.Exchange, d.RoutingKey, d.Type, d.Body, d.Headers))
		}
	}
	for id := range byID {
		if !seen[id] {
			problems = append(problems, "not replayed: "+id)
		}
	}
	for k, ids := range order {
		if strings.Join(gotOrder[k], ",") != strings.Join(ids, ",") {
			problems = append(problems, fmt.Sprintf("partition %q replayed out of commit order", k))
		}
	}
	if len(problems) > 0 {
		t.Fatalf("%d replayed deliveries, want %d:\n  %s", len(got), len(want), strings.Join(problems[:min(len(problems), 20)], "\n  "))
	}
}

// replay takes --amqp-url as run does: several URLs separated by commas,
// the nodes of a cluster, dialled in turn until one answers. Whichever
// node answers, the range is replayed, and nothing it prints shows a
// password of any of the URLs (a list once dialled as one URL made the
// broker quote the rest of the list, credentials included, as an unknown
// vhost).
func TestReplayClusterURLs(t *testing.T) {
	t.Parallel()
	ctx := testenv.WorkContext(t)
	db := testenv.MySQL(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	// A password shorter than redact.MinSecret, which the last line of
	// defence (redact.Writer) leaves alone: only the error paths themselves
	// can keep it out.
	short := secretUnderTest{"the short AMQP password of the third URL", "Q~z", nil}
	scan := newLeakScanner(t, leakAMQPPassword, leakNode2Password, short)
	live := amqpURLWith(t, b.URL, rabbitUser(t, leakAMQPPassword.password), leakAMQPPassword.password)
	dead := amqpURLWith(t, "amqp://127.0.0.1:1/", "leak2", leakNode2Password.password)
	deadShort := amqpURLWith(t, "amqp://127.0.0.1:1/", "leak3", short.password)
	from := binlogPos(ctx, t, db)
	msgs := writeTxns(ctx, t, db, validator.New(), b.Exchange, "range", 5)
	to := binlogPos(ctx, t, db)
	for _, tc := range []struct{ name, urls string }{
		{"the first node answers", live + "," + dead},
		{"the first node is down", dead + ", " + live},
		{"a short password after the node that answers", live + "," + deadShort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scan := &leakScanner{t: t, needles: scan.needles}
			r := runBinary(t, relayBinary(t), nil, "replay", "--mysql-dsn", db.DSN, "--amqp-url", tc.urls,
				"--default-exchange", b.Exchange, "--from-gtid", from, "--to-gtid", to, "--json", "--log-level", "debug")
			scan.checkResult("replay", r)
			var sum struct{ Messages, Confirmed int }
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sum) != nil || sum.Confirmed != len(msgs) {
				t.Fatalf("replay with a list of URLs: %+v; want exit 0 with %d messages confirmed", r, len(msgs))
			}
		})
	}
}
