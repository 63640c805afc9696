package main

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/streams"
)

// Finding 2 against the broker and the database: a term that does not
// continue the stored ids pushes the producers past them; if it stores no
// position with its own ids, a later term must not continue the old ones.
// Here: a relay with 2 partitions stores its ids; a relay with 3 partitions
// publishes every new row (its producers r1-0 and r1-1 go past the stored
// ids with other messages) and never stores a position (a trigger refuses
// the ids of 3 partitions, as a crash before the first acknowledgement
// would); then 2 partitions again, from the stored position with the
// stored ids. Continuing them gave its messages the ids the 3-partition term
// had used for other messages, and the broker dropped them: the rows routed
// to partition 2 by the 3-partition term never reached partitions 0 and 1.
// The 3-partition term now clears the stored ids before it publishes, and
// the last term numbers freshly: every message arrives in partitions 0 and 1.
func TestRunStreamPartitionCountChangedAndBackLosesNothing(t *testing.T) {
	t.Parallel()
	ctx, db, b, sc2, _ := streamSetup(t, 2)
	sc3 := sc2
	sc3.Partitions = 3
	pub, err := streams.Dial(sc3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Declare(); err != nil {
		t.Fatal(err)
	}
	_ = pub.Close()
	testenv.DeleteStreamsAtCleanup(t, sc3.URL, sc3.PartitionName(2))
	args := relayArgs(t, db, b, append(leaderFlags(), "--relay-name", "r1", "--stream", sc2.Stream, "--mode", "binlog")...)
	two := newRelayProc(t, append(args, "--stream-partitions", "2")...)
	three := newRelayProc(t, append(args, "--stream-partitions", "3")...)
	load := func(v *validator.Validator, n int) {
		testload.Produce(ctx, t, db.SQL, v, testload.Load{Producers: 2, Partitions: 20, Total: n, Exchange: b.Exchange})
	}
	complete := func(step string, v *validator.Validator) {
		t.Helper()
		if err := v.WaitComplete(ctx); err != nil {
			t.Fatalf("%s: %v (%d of %d messages)", step, err, v.Received(), v.ExpectedCount())
		}
		if err := v.Check(validator.AtLeastOnce); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}

	// 1. Two partitions: ids stored with the position.
	v1 := consumeStreams(t, sc2)
	load(v1, 100)
	two.start()
	// The rows written before the relay tails go out through the first
	// start's sweep, which numbers freshly and stores no ids: the next
	// rows must come from the binlog, which a busy machine may start
	// reading only after a while.
	two.waitLog(ctx, "tailing the binlog")
	load(v1, 200)
	complete("two partitions", v1)
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	if code, _ := two.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM: exit code %d", code)
	}
	var stored string
	if err := db.SQL.QueryRowContext(ctx, "SELECT COALESCE(stream_ids, '') FROM outbox_relay_progress WHERE relay_name = 'r1'").Scan(&stored); err != nil || stored == "" {
		t.Fatalf("ids stored by the 2-partition relay: %q, %v", stored, err)
	}

	// 2. Three partitions, never storing a position with its ids.
	if _, err := db.SQL.ExecContext(ctx, `CREATE TRIGGER refuse_three BEFORE UPDATE ON outbox_relay_progress FOR EACH ROW
		IF NEW.stream_ids LIKE '%"partitions":3%' THEN
			SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'test: the 3-partition term stores no position';
		END IF`); err != nil {
		t.Fatal(err)
	}
	v3 := consumeStreams(t, sc3)
	three.start()
	load(v3, 300)
	complete("three partitions", v3)
	three.kill()
	if _, err := db.SQL.ExecContext(ctx, "DROP TRIGGER refuse_three"); err != nil {
		t.Fatal(err)
	}

	// 3. Two partitions again: the 300 rows are still pending.
	v2 := consumeStreams(t, sc2)
	v2.Expect(v3.ExpectedMessages()...)
	two.start()
	complete("two partitions again", v2)
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	if code, _ := two.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM: exit code %d", code)
	}
}
