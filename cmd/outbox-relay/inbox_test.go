package main

import (
	"context"
	"database/sql"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/dedup"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/position"
)

// inboxEffects is a dedup.Consumer on its own queue whose handler records
// one effect row per message it runs for: the consuming side of a fault
// test, where the relay's duplicates must not become duplicate effects.
type inboxEffects struct {
	c  *dedup.Consumer
	db *sql.DB
}

func startInboxEffects(ctx context.Context, t *testing.T, db *testenv.DB, b *testenv.Broker, queue string) *inboxEffects {
	t.Helper()
	if _, err := db.SQL.ExecContext(ctx, `CREATE TABLE inbox_effects (
		id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, message_id CHAR(36) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	effect := func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO inbox_effects (message_id) VALUES (?)", d.MessageId)
		return err
	}
	c := &dedup.Consumer{
		Inbox: dedup.New(db.SQL, "fault-test"), Queue: queue,
		Prefetch: 128, Workers: 4, Unknown: effect, RetryDelay: 50 * time.Millisecond,
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, ch) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("inbox consumer: %v", err)
		}
		conn.Close()
	})
	return &inboxEffects{c: c, db: db.SQL}
}

// check waits until the consumer has handled every message of total (its
// processed count reaches it) and asserts one effect per message.
func (e *inboxEffects) check(ctx context.Context, t *testing.T, total int) dedup.Stats {
	t.Helper()
	if err := progress.Wait(ctx, "messages through the inbox", func() int64 { return e.c.Stats().Processed },
		func() bool { return e.c.Stats().Processed >= int64(total) }); err != nil {
		t.Fatalf("inbox consumer processed %d of %d messages: %+v: %v", e.c.Stats().Processed, total, e.c.Stats(), err)
	}
	var effects, distinct int
	if err := e.db.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(DISTINCT message_id) FROM inbox_effects").Scan(&effects, &distinct); err != nil {
		t.Fatal(err)
	}
	st := e.c.Stats()
	if effects != total || distinct != total || st.Failed != 0 {
		t.Fatalf("inbox: %d effects of %d distinct messages, want %d of each; stats %+v", effects, distinct, total, st)
	}
	return st
}

// uncoveredTail waits until deliveries have stopped coming (the relay is not
// running) and returns how many delivered messages belong to transactions
// after the stored position: a restart starts there, so it publishes each of
// them again. (Rows of such transactions may already be deleted: rows are
// acknowledged as they are confirmed, the position only past transactions
// whose every row is; counting the rows left in the outbox would miss them.)
// The binlog between the stored position and the server's current one is
// read with the relay's own tailer.
func (c *countingConsumer) uncoveredTail(ctx context.Context, t *testing.T, db *testenv.DB) int {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	for last := -1; ; {
		_, d, _ := c.stats()
		if d == last {
			break
		}
		last = d
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(300 * time.Millisecond):
		}
	}
	var from position.Position
	if err := db.SQL.QueryRowContext(ctx, "SELECT COALESCE(flavor, ''), COALESCE(gtid_set, '') "+
		"FROM outbox_relay_progress WHERE relay_name = 'default'").Scan(&from.Flavor, &from.GTIDSet); err != nil {
		t.Fatal(err)
	}
	ids, err := testload.MessageIDsAfter(ctx, db.SQL, canal.Config{
		Host: db.Host, Port: db.Port, User: db.User, Password: db.Password,
		ServerID: testenv.ServerID(t), Schema: db.Name, Table: "outbox",
	}, from)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, id := range ids {
		if c.seen[id.String()] {
			n++
		}
	}
	return n
}
