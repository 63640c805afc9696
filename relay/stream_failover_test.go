package relay

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/streams"
)

// streamFailoverRig is a failoverRig whose relay publishes into a super
// stream of its own (sc), read by f.v, reaching the database through vip
// and the binlog through binlogVIP, two proxies in front of the primary.
func streamFailoverRig(t *testing.T, parts int) (*failoverRig, streams.Config) {
	t.Helper()
	primary, db, b := privateSetup(t)
	f := &failoverRig{primary: primary, replica: primary.StartReplica(t), db: db, b: b}
	f.vip, f.binlogVIP = testenv.Proxy(t, primary.Addr()), testenv.Proxy(t, primary.Addr())
	u, err := streams.FromAMQP(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	sc := streams.Config{Stream: fmt.Sprintf("test-%s-%d", t.Name(), time.Now().UnixNano()), Partitions: parts,
		URL: u, Window: 100}
	names := declarePartitions(t, sc)
	testenv.DeleteStreamsAtCleanup(t, u, names...)
	f.v = validator.New()
	stop, err := validator.ConsumeStreams(u, names, f.v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	sc.Producer = relayNameFor(db.Name) // as the CLI does: the producers are named after the relay
	f.rr = f.runViaProxies(t, Config{
		AMQPURL: b.URL, DefaultExchange: b.Exchange, Stream: sc,
		// The acknowledgements hang for a few seconds before the
		// failover; a heartbeat that hangs twice this ends the term.
		CheckpointInterval: time.Second, HeartbeatInterval: 5 * time.Second,
	})
	return f, sc
}

// declarePartitions declares sc's partition streams (the topology step)
// and returns their names.
func declarePartitions(t *testing.T, sc streams.Config) []string {
	t.Helper()
	pub, err := streams.Dial(sc)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pub.Declare()
	pub.Close()
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, sc.Partitions)
	for i := range names {
		names[i] = sc.PartitionName(i)
	}
	return names
}

// storedStreamIDs is the progress row's stream_ids on db.
func storedStreamIDs(ctx context.Context, t *testing.T, db *sql.DB, name string) checkpoint.StreamIDs {
	t.Helper()
	var col sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT stream_ids FROM outbox_relay_progress WHERE relay_name = ?", name).Scan(&col); err != nil {
		t.Fatal(err)
	}
	var ids checkpoint.StreamIDs
	if !col.Valid {
		t.Fatalf("no stream ids stored for %s", name)
	}
	if err := json.Unmarshal([]byte(col.String), &ids); err != nil {
		t.Fatalf("stream_ids %q: %v", col.String, err)
	}
	return ids
}

// Issue 33 (c), a failover behind one address with the stream destination:
// 0 duplicates. The relay tails into 4 partition streams; its
// acknowledgements hang (the pool's proxy stalls) while it publishes a
// backlog, so the broker holds ids above the stored ones; the replica
// catches up, the primary is killed and the replica promoted behind the
// same addresses. The same relay process carries the stored publishing ids
// over to the promoted replica (its record of what it published there is
// contained in the replica's GTID state, one domain, gtid_strict_mode, no
// broker id above what it issued): the unacknowledged tail goes out again
// under the same ids, which the broker drops. Every message is in the
// streams exactly once, in commit order per key.
func TestRelayStreamFailoverToCaughtUpReplicaExactlyOnce(t *testing.T) {
	t.Parallel()
	const parts = 4
	f, sc := streamFailoverRig(t, parts)
	ctx := testenv.WorkContext(t)
	waitFor(ctx, t, f.rr, "tailing", f.rr.r.Tailing)
	// Some rows through the tail, acknowledged: ids stored with the
	// checkpoint, read on the primary.
	produce(ctx, t, f.db, f.b, f.v, load{producers: 2, partitions: 20, total: 300, bigTxn: 20, bigShare: 0.3})
	if err := f.v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, f.db, "SELECT COUNT(*) FROM outbox", 0)
	name := relayNameFor(f.db.Name)
	before := storedStreamIDs(ctx, t, f.db.SQL, name)

	// From now on nothing the relay publishes is acknowledged.
	f.vip.Stall()
	const backlog = 2_000
	received := f.v.Received()
	produce(ctx, t, f.db, f.b, f.v, load{producers: 4, partitions: 40, total: backlog, bigTxn: 100, bigShare: 0.5})
	// The relay has published some of it (the broker holds it), not all.
	if err := progress.Wait(ctx, "wait for unacknowledged deliveries", func() int64 { return int64(f.v.Received()) },
		func() bool { return f.v.Received() >= received+200 }); err != nil {
		t.Fatal(err)
	}
	f.primary.WaitReplicaCaughtUp(t, f.replica)

	rdb := f.failover(t)
	f.binlogVIP.Retarget(f.replica.Addr())
	f.vip.Unstall()
	// What the promoted replica stores is what the relay will resume from;
	// the broker holds more: the unacknowledged tail.
	stored := storedStreamIDs(ctx, t, rdb, name)
	pub, err := streams.Dial(sc)
	if err != nil {
		t.Fatal(err)
	}
	last, err := pub.LastIDs(ctx, sc.Producer)
	pub.Close()
	if err != nil {
		t.Fatal(err)
	}
	var tail uint64
	for i, l := range last {
		if l > stored.IDs[i] {
			tail += l - stored.IDs[i]
		}
	}
	t.Logf("failover with %d messages in the broker above the replica's stored ids %v (broker %v; before the stall %v); %d rows after its checkpoint",
		tail, stored.IDs, last, before.IDs, len(f.replayable))
	if tail == 0 {
		t.Fatal("the broker held nothing the replica's checkpoint did not: the failover proved nothing")
	}

	// Producers go on writing on the new primary.
	produce(ctx, t, &testenv.DB{SQL: rdb}, f.b, f.v, load{producers: 2, partitions: 20, total: 500, bigTxn: 20, bigShare: 0.3})
	if err := f.v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, &testenv.DB{SQL: rdb}, "SELECT COUNT(*) FROM outbox", 0)
	f.checkRunning(t)
	if d := f.v.Duplicates(); d != 0 {
		t.Fatalf("%d duplicates in the streams after the failover (unacknowledged tail %d)", d, tail)
	}
	if err := f.v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	after := storedStreamIDs(ctx, t, rdb, name)
	if after.Server == stored.Server {
		t.Fatalf("ids still stored as read on %s after the failover", after.Server)
	}
	t.Logf("%d messages exactly once; the ids now stored on %s: %v", f.v.ExpectedCount(), after.Server, after.IDs)
}
