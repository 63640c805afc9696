package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// bumpIDs stores one message per partition of sc under the producers
// "<prefix>-<i><suffix>" with a publishing id ahead above the broker's
// last: what a term leaves on the broker when it published and did not
// acknowledge (or an earlier history of the name). A start whose ids are
// not the continuation of its stored ones must start above these, or the
// broker drops its messages as duplicates. ahead is above every epoch's
// base in these tests (streams.EpochBase), so the broker's last id, not
// the epoch, decides.
func bumpIDs(t *testing.T, sc streams.Config, prefix, suffix string, ahead uint64) {
	t.Helper()
	pub, err := streams.Dial(sc)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ctx := context.Background()
	done := make(chan publish.Result, sc.Partitions)
	for i := 0; i < sc.Partitions; i++ {
		name := fmt.Sprintf("%s-%d%s", prefix, i, suffix)
		last, err := pub.LastID(ctx, name, i)
		if err != nil {
			t.Fatal(err)
		}
		pr, err := pub.ProducerNamed(ctx, name, i)
		if err != nil {
			t.Fatal(err)
		}
		m := publish.Message{Seq: last + ahead}
		m.Publishing.MessageId = "bump"
		if err := pr.Publish(ctx, m, func(r publish.Result) { done <- r }); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < sc.Partitions; i++ {
		if r := <-done; r.Outcome != publish.Confirmed {
			t.Fatalf("bump: %+v", r)
		}
	}
}

// Every start whose publishing ids are not the continuation of stored ones
// numbers above the broker's last ids, so the broker drops nothing that was
// never stored (docs/operations.md, "The stream destination"), shown case
// by case with ids left ahead on the broker before each: the first start
// (rows pending, delivered by the sweep, then the tail), `checkpoint set`
// past a tail that was published and not acknowledged, poll mode and the
// handover back to the binlog, and delayed rows (the due-time sweep's own
// producers). In each, every message arrives.
func TestRunStreamNeverLosesToDeduplication(t *testing.T) {
	t.Parallel()
	ctx, db, b, sc, _ := streamSetup(t, 2)
	args := relayArgs(t, db, b, append(leaderFlags(), "--relay-name", "r1", "--stream", sc.Stream, "--stream-partitions", "2")...)
	binlog := newRelayProc(t, append(args, "--mode", "binlog")...)
	poll := newRelayProc(t, append(args, "--mode", "poll", "--poll-interval", "50ms")...)
	load := func(v *validator.Validator, n int) {
		testload.Produce(ctx, t, db.SQL, v, testload.Load{Producers: 2, Partitions: 10, Total: n, Exchange: b.Exchange})
	}
	complete := func(step string, v *validator.Validator) {
		t.Helper()
		if err := v.WaitComplete(ctx); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
		if err := v.Check(validator.AtLeastOnce); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		t.Logf("%s: %d messages, %d duplicates", step, v.ExpectedCount(), v.Duplicates())
	}
	stop := func(p *relayProc) {
		t.Helper()
		if code, took := p.terminate(time.Minute); code != 0 {
			t.Fatalf("SIGTERM: exit code %d after %v", code, took)
		}
	}

	// step leaves ids of the producers "<prefix>-<i><suffix>" ahead on the broker,
	// writes before rows, starts p, writes during rows (and what extra
	// writes), and checks that every message arrived before stopping p.
	step := func(name, prefix, suffix string, p *relayProc, before, during int, extra func(v *validator.Validator)) {
		t.Helper()
		bumpIDs(t, sc, prefix, suffix, 1<<50)
		v := consumeStreams(t, sc)
		if before > 0 {
			load(v, before)
		}
		p.start()
		if extra != nil {
			extra(v)
		}
		load(v, during)
		complete(name, v)
		stop(p)
	}

	// First start, with rows pending.
	step("first start", "r1", "", binlog, 200, 300, nil)

	// A tail published and not acknowledged (ids ahead of the stored
	// ones), then `checkpoint set` past it: the stored ids no longer
	// continue the position.
	var gtid string
	if err := db.SQL.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&gtid); err != nil {
		t.Fatal(err)
	}
	if r := runBinary(t, relayBinary(t), nil, "checkpoint", "set", "--mysql-dsn", db.DSN, "--relay-name", "r1", "--gtid", gtid); r.code != 0 {
		t.Fatalf("checkpoint set: %+v", r)
	}
	step("after checkpoint set", "r1", "", binlog, 0, 300, nil)

	// Poll mode, then the handover back to the binlog.
	step("poll mode", "r1", "", poll, 0, 300, nil)
	step("handover to the binlog", "r1", "", binlog, 100, 200, nil)

	// Delayed rows go out through the due-time sweep's producers
	// "r1-<i>-delayed", beside the lanes.
	step("delayed rows", "r1", "-delayed", binlog, 0, 100, func(v *validator.Validator) {
		for i := 0; i < 10; i++ {
			insertDelayed(ctx, t, db, v, b.Exchange, fmt.Sprintf("delayed-%d", i%3))
		}
	})
}

// insertDelayed inserts one row due 300 ms from now, and tells v.
func insertDelayed(ctx context.Context, t *testing.T, db *testenv.DB, v *validator.Validator, exchange, key string) {
	t.Helper()
	u, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	id := outbox.MessageID(u)
	payload := []byte(`{"delayed":true}`)
	if _, err := db.SQL.ExecContext(ctx, `INSERT INTO outbox (message_id, partition_key, exchange, routing_key, message_type,
		headers, payload, available_at) VALUES (?, ?, ?, 'rk.delayed', 'test.delayed', '{"d":1}', ?, UTC_TIMESTAMP(6) + INTERVAL 0.3 SECOND)`,
		id[:], key, exchange, payload); err != nil {
		t.Fatal(err)
	}
	v.Expect(validator.Expected{ID: id, PartitionKey: key, Exchange: exchange, RoutingKey: "rk.delayed",
		MessageType: "test.delayed", Payload: payload, Headers: map[string]any{"d": int64(1)}})
}
