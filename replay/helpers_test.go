package replay

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// migrated applies the schema to db.
func migrated(t *testing.T, db *testenv.DB) {
	t.Helper()
	db.Migrate(testenv.Context(t, time.Minute), t)
}

// baseConfig is a replay of db's outbox to b.
func baseConfig(t *testing.T, db *testenv.DB, b *testenv.Broker) Config {
	return Config{
		MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange,
		ServerID: testenv.ServerID(t), Logger: zaptest.NewLogger(t).Named("replay"),
	}
}

// written is one message a test committed, in commit order.
type written struct {
	id         outbox.MessageID
	key        string
	routingKey string
	msgType    string
}

// commit writes msgs in one transaction; when at is not zero, the session's
// timestamp (and so the binlog event time of the transaction) is at.
func commit(ctx context.Context, t *testing.T, db *sql.DB, at time.Time, msgs ...outbox.Message) []written {
	t.Helper()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if !at.IsZero() {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET timestamp = %d", at.Unix())); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if _, err := conn.ExecContext(context.Background(), "SET timestamp = DEFAULT"); err != nil {
				t.Error(err)
			}
		}()
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := outbox.Enqueue(ctx, tx, msgs...)
	if err != nil {
		_ = tx.Rollback()
		t.Fatalf("enqueue: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	out := make([]written, len(msgs))
	for i, m := range msgs {
		out[i] = written{id: ids[i], key: m.PartitionKey, routingKey: m.RoutingKey, msgType: m.MessageType}
	}
	return out
}

// batch is n messages over the given partition keys in turn.
func batch(tag string, n int, keys ...string) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		k := keys[i%len(keys)]
		msgs[i] = outbox.Message{
			PartitionKey: k, RoutingKey: "rk." + tag, MessageType: "test." + tag,
			Payload: fmt.Appendf(nil, `{"batch":%q,"i":%d}`, tag, i),
			Headers: map[string]any{"batch": tag},
		}
	}
	return msgs
}

func gtidPos(ctx context.Context, t *testing.T, db *sql.DB) string {
	t.Helper()
	var pos string
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	return pos
}

// drain takes every message in queue (basic.get until it is empty). After a
// replay returned, everything it published is confirmed, so in the queue.
func drain(t *testing.T, url, queue string) []amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// checkReplayed asserts that got are exactly the messages of want, each
// once, with x-replay true and the epoch, in want's order per partition key.
func checkReplayed(t *testing.T, got []amqp.Delivery, want []written, epoch int64) {
	t.Helper()
	wantIDs := map[string]string{} // id → key
	order := map[string][]string{}
	for _, w := range want {
		wantIDs[w.id.String()] = w.key
		if w.key != "" {
			order[w.key] = append(order[w.key], w.id.String())
		}
	}
	var problems []string
	seen := map[string]int{}
	gotOrder := map[string][]string{}
	for _, d := range got {
		seen[d.MessageId]++
		key, ok := wantIDs[d.MessageId]
		if !ok {
			problems = append(problems, "unexpected message "+d.MessageId)
			continue
		}
		if key != "" {
			gotOrder[key] = append(gotOrder[key], d.MessageId)
		}
		if v, _ := d.Headers["x-replay"].(bool); !v {
			problems = append(problems, fmt.Sprintf("%s: x-replay is %v, want true", d.MessageId, d.Headers["x-replay"]))
		}
		if e, _ := d.Headers["x-relay-epoch"].(int64); e != epoch {
			problems = append(problems, fmt.Sprintf("%s: x-relay-epoch %v, want %d", d.MessageId, d.Headers["x-relay-epoch"], epoch))
		}
		if pk, _ := d.Headers["x-partition-key"].(string); pk != key {
			problems = append(problems, fmt.Sprintf("%s: x-partition-key %q, want %q", d.MessageId, pk, key))
		}
	}
	for id, n := range seen {
		if n > 1 {
			problems = append(problems, fmt.Sprintf("%s delivered %d times", id, n))
		}
	}
	for id := range wantIDs {
		if seen[id] == 0 {
			problems = append(problems, "missing "+id)
		}
	}
	for k, ids := range order {
		if strings.Join(gotOrder[k], ",") != strings.Join(ids, ",") {
			problems = append(problems, fmt.Sprintf("partition %q out of order", k))
		}
	}
	if len(problems) > 0 {
		if len(problems) > 20 {
			problems = problems[:20]
		}
		t.Fatalf("%d replayed messages, want %d:\n  %s", len(got), len(want), strings.Join(problems, "\n  "))
	}
}

// tableDump is every row of table as text, in primary key order: equal
// dumps mean an untouched table.
func tableDump(ctx context.Context, t *testing.T, db *sql.DB, table string) string {
	t.Helper()
	rows, err := db.QueryContext(ctx, "SELECT * FROM "+table+" ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	vals := make([]sql.RawBytes, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			fmt.Fprintf(&b, "%s=%q ", cols[i], v)
		}
		b.WriteByte('\n')
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// serverSecond is the server's clock now, in whole seconds.
func serverSecond(ctx context.Context, t *testing.T, db *sql.DB) time.Time {
	t.Helper()
	var now int64
	if err := db.QueryRowContext(ctx, "SELECT UNIX_TIMESTAMP()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return time.Unix(now, 0).UTC()
}

// nextSecond waits until the server's clock shows a later second than now
// and returns it: binlog event times have whole seconds.
func nextSecond(ctx context.Context, t *testing.T, db *sql.DB) time.Time {
	t.Helper()
	var start int64
	if err := db.QueryRowContext(ctx, "SELECT UNIX_TIMESTAMP()").Scan(&start); err != nil {
		t.Fatal(err)
	}
	step, cancel := progress.Step(ctx)
	defer cancel()
	for {
		var now int64
		if err := db.QueryRowContext(ctx, "SELECT UNIX_TIMESTAMP()").Scan(&now); err != nil {
			t.Fatal(err)
		}
		if now > start {
			return time.Unix(now, 0).UTC()
		}
		select {
		case <-step.Done():
			t.Fatalf("the server's clock did not move past %d: %v", start, step.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
