package poller_test

import (
	"fmt"
	"slices"
	"strconv"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/poller"
	"github.com/outbox-relay/outbox-relay/publish"
)

// A round spans keys: with a backlog of many partitions, each many rows
// deep, one round claims the heads of as many distinct partitions as its
// batch holds (one message per key on the wire at once), not the heads of
// the few partitions whose rows come first in partition-key order with
// their followers (which the broker's confirms would let out one at a
// time per key). With one worker the rounds reach the queue one after
// another, so the first Batch messages on the queue are the first round.
func TestRoundClaimsTheHeadsOfManyPartitions(t *testing.T) {
	for _, mode := range []string{checkpoint.Delete, checkpoint.Mark} {
		t.Run(mode, func(t *testing.T) {
			const partitions, depth = 60, 20
			e := setup(t, mode)
			ctx := testenv.WorkContext(t)
			bulkLoad(ctx, t, e.pool, partitions*depth, partitions)
			p := e.poller(t, func(c *poller.Config) { c.Workers = 1; c.Batch = partitions })
			if n, err := p.Drain(ctx); err != nil || n != partitions*depth {
				t.Fatalf("Drain: %d rows, %v; want %d", n, err, partitions*depth)
			}
			keys := map[string]int{}
			for i, d := range firstMessages(t, e, partitions) {
				keys[d.Headers[publish.HeaderPartitionKey].(string)]++
				if id := d.Headers["x-outbox-id"].(int64); id > int64(partitions) {
					t.Errorf("message %d of the first round is row %d: not one of the partitions' heads (rows 1..%d)", i, id, partitions)
				}
			}
			if len(keys) != partitions {
				t.Fatalf("the first round of %d messages spans %d partitions (%v), want %d: its heads and their followers, not the heads of every partition",
					partitions, len(keys), keys, partitions)
			}
		})
	}
}

// A round whose batch holds more than the heads spreads the rest over its
// partitions: with 3 partitions 40 rows deep and a batch of 30, the first
// round takes 10 rows of each (the round lasts as long as its longest
// partition, whose rows go out one confirm after another), not the 30
// first rows of one partition in key order.
func TestRoundSpreadsFollowersOverItsPartitions(t *testing.T) {
	const partitions, depth, batch = 3, 40, 30
	e := setup(t, checkpoint.Delete)
	ctx := testenv.WorkContext(t)
	bulkLoad(ctx, t, e.pool, partitions*depth, partitions)
	p := e.poller(t, func(c *poller.Config) { c.Workers = 1; c.Batch = batch })
	if n, err := p.Drain(ctx); err != nil || n != partitions*depth {
		t.Fatalf("Drain: %d rows, %v; want %d", n, err, partitions*depth)
	}
	keys := map[string]int{}
	for _, d := range firstMessages(t, e, batch) {
		keys[d.Headers[publish.HeaderPartitionKey].(string)]++
	}
	for k, n := range keys {
		if n != batch/partitions {
			t.Errorf("the first round took %d rows of partition %s, want %d of each (%v)", n, k, batch/partitions, keys)
		}
	}
}

// firstMessages takes the first n messages off the test's queue.
func firstMessages(t *testing.T, e *env, n int) []amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(e.broker.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]amqp.Delivery, 0, n)
	for i := range n {
		d, ok, err := ch.Get(e.broker.Queue, true)
		if err != nil || !ok {
			t.Fatalf("message %d of the first round: ok %v, %v", i, ok, err)
		}
		out = append(out, d)
	}
	return out
}

// Partitions written in bulk, one after another, each deeper than a round's
// listing: the oldest rows and the key-order listing show a few new
// partitions per round, and the rounds keep looking at the partitions they
// have seen, so they come to span most partitions of the backlog (here
// 20; the round's batch is 20 rows, so its last partitions come in as its
// first ones empty) rather than the two or four the listings hold at any one
// time.
func TestRoundsComeToSpanBulkPartitions(t *testing.T) {
	const partitions, depth = 20, 60
	e := setup(t, checkpoint.Delete)
	ctx := testenv.WorkContext(t)
	for i := range partitions {
		if _, err := e.pool.ExecContext(ctx, `INSERT INTO outbox (message_id, partition_key, routing_key, payload)
			SELECT UNHEX(REPLACE(UUID(), '-', '')), ?, 'bulk', 'x' FROM seq_1_to_`+strconv.Itoa(depth), fmt.Sprintf("p%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	core, logs := observer.New(zap.DebugLevel)
	p := e.poller(t, func(c *poller.Config) { c.Workers = 1; c.Batch = partitions; c.Logger = zap.New(core) })
	if n, err := p.Drain(ctx); err != nil || n != partitions*depth {
		t.Fatalf("Drain: %d rows, %v; want %d", n, err, partitions*depth)
	}
	widest := int64(0)
	var spans []int64
	for _, entry := range logs.FilterMessage("poll round committed").All() {
		n := entry.ContextMap()["partitions"].(int64)
		spans = append(spans, n)
		widest = max(widest, n)
	}
	t.Logf("partitions per round: %v", spans)
	if widest < partitions*3/4 {
		t.Fatalf("the widest round spans %d partitions, want at least %d of %d (partitions per round: %v)", widest, partitions*3/4, partitions, spans)
	}
}

// A backlog of few partitions (fewer than a quarter of a batch), each
// deep: once the listings have settled on them, a round takes up to four
// batches of their rows (the claim and the commit, during which none of
// them is on the wire, then come once per four batches), and every message
// still arrives once, in order per partition.
func TestFewPartitionsMakeDeeperRounds(t *testing.T) {
	for _, mode := range []string{checkpoint.Delete, checkpoint.Mark} {
		t.Run(mode, func(t *testing.T) {
			const batch, total = 50, 3000
			e := setup(t, mode)
			v := consume(t, e.broker)
			ctx := testenv.WorkContext(t)
			produce(ctx, t, e, v, load{producers: 4, partitions: 6, total: total, bigTxn: 100, bigShare: 0.5})
			core, logs := observer.New(zap.DebugLevel)
			p := e.poller(t, func(c *poller.Config) { c.Batch = batch; c.Logger = zap.New(core) })
			if n, err := p.Drain(ctx); err != nil || n != total {
				t.Fatalf("Drain: %d rows, %v; want %d", n, err, total)
			}
			if err := v.WaitComplete(ctx); err != nil {
				t.Fatal(err)
			}
			if err := v.Check(validator.ExactlyOnce); err != nil {
				t.Fatal(err)
			}
			rows := roundRows(logs)
			if deepest := slices.Max(rows); deepest <= batch || deepest > 4*batch {
				t.Fatalf("the deepest round holds %d rows, want more than the batch (%d) and at most 4 batches (rows per round: %v)", deepest, batch, rows)
			}
		})
	}
}

// Deeper rounds stay within their memory bound, measured on the rows they
// take, not on their heads: one partition of 41 rows of 1 KiB, then 200 of
// 150 KiB. The first round (40 rows; the listings have not settled yet)
// leaves a 1 KiB head to the second, whose followers are all big: a round of
// a batch holds about 6 MiB of them, and a deeper round takes another batch
// only while that batch, at the average size of the rows it holds, keeps it
// within 16 MiB (priced at its 1 KiB head, it would take 160 rows: 23 MiB).
func TestDeepRoundsStayWithin16MiB(t *testing.T) {
	const batch, depth, big = 40, 200, 150 << 10
	e := setup(t, checkpoint.Delete)
	ctx := testenv.WorkContext(t)
	if _, err := e.pool.ExecContext(ctx, `INSERT INTO outbox (message_id, partition_key, routing_key, payload)
		SELECT UNHEX(REPLACE(UUID(), '-', '')), 'p', 'bulk', REPEAT('h', 1024) FROM seq_1_to_41`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.ExecContext(ctx, `INSERT INTO outbox (message_id, partition_key, routing_key, payload)
		SELECT UNHEX(REPLACE(UUID(), '-', '')), 'p', 'bulk', REPEAT('x', ?) FROM seq_1_to_`+strconv.Itoa(depth), big); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	p := e.poller(t, func(c *poller.Config) { c.Workers = 1; c.Batch = batch; c.Logger = zap.New(core) })
	if n, err := p.Drain(ctx); err != nil || n != depth+41 {
		t.Fatalf("Drain: %d rows, %v; want %d", n, err, depth+41)
	}
	rows := roundRows(logs)
	t.Logf("rows per round: %v", rows)
	if deepest := slices.Max(rows); deepest <= batch || deepest*big > 16<<20 {
		t.Fatalf("the deepest round holds %d rows of 150 KiB (%d MiB), want more than a batch (%d) and at most 16 MiB: rows per round %v",
			deepest, deepest*big>>20, batch, rows)
	}
}

// roundRows is the rows of each committed round, from the poller's debug log.
func roundRows(logs *observer.ObservedLogs) []int64 {
	var rows []int64
	for _, entry := range logs.FilterMessage("poll round committed").All() {
		rows = append(rows, entry.ContextMap()["rows"].(int64))
	}
	if len(rows) == 0 {
		rows = append(rows, 0)
	}
	return rows
}
