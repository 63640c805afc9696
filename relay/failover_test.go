package relay

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// failoverRig is a private MariaDB primary with a GTID replica, and a
// "virtual IP" (a TCP proxy) in front of the primary that the relay talks to:
// a failover moves the proxy to the promoted replica, so one relay process
// sees its connections die and reconnects to another server.
type failoverRig struct {
	primary, replica *testenv.Server
	db               *testenv.DB
	b                *testenv.Broker
	vip              *testenv.FaultProxy
	binlogVIP        *testenv.FaultProxy // the binlog stream's own proxy, when it has one (else it goes through vip)
	v                *validator.Validator
	rr               *relayRun
	// replayable are the message ids of the rows the promoted replica's
	// binlog holds after its replicated checkpoint, read at the failover
	// before the relay could reach it: what the relay reads again, and so
	// the most it can publish twice.
	replayable []outbox.MessageID
}

func newFailoverRig(t *testing.T, accept bool, tweak ...func(*Config)) *failoverRig {
	t.Helper()
	primary, db, b := privateSetup(t)
	f := &failoverRig{primary: primary, replica: primary.StartReplica(t), db: db, b: b}
	f.vip = testenv.Proxy(t, primary.Addr())
	f.v = consume(t, b, b.Queue)
	dsn, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	dsn.Addr = f.vip.Addr()
	cfg := Config{
		MySQLDSN: dsn.FormatDSN(), AMQPURL: b.URL, DefaultExchange: b.Exchange,
		CheckpointInterval: time.Second, HeartbeatInterval: 500 * time.Millisecond,
		AcceptLostGTIDs: accept,
	}
	for _, tw := range tweak {
		tw(&cfg)
	}
	f.rr = runRelay(t, cfg, nil)
	return f
}

// failover kills the primary, promotes the replica, records what the relay
// will read again there (replayable) and moves the virtual IP to it. It
// returns a pool on the test's database on the new primary.
func (f *failoverRig) failover(t *testing.T) *sql.DB {
	t.Helper()
	f.primary.Kill(t)
	f.replica.Promote(t)
	db, err := sql.Open("mysql", f.replica.DSN(f.db.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := testenv.Context(t, time.Minute)
	var from position.Position
	if err := db.QueryRowContext(ctx, "SELECT COALESCE(flavor, ''), COALESCE(gtid_set, '') FROM outbox_relay_progress WHERE relay_name = ?", relayNameFor(f.db.Name)).
		Scan(&from.Flavor, &from.GTIDSet); err != nil {
		t.Fatal(err)
	}
	if f.replayable, err = testload.MessageIDsAfter(ctx, db, canal.Config{
		Host: f.replica.Host(), Port: f.replica.Port(), User: "root", ServerID: testenv.ServerID(t),
		Schema: f.db.Name, Table: "outbox",
	}, from); err != nil {
		t.Fatal(err)
	}
	f.vip.Retarget(f.replica.Addr())
	return db
}

// checkRunning fails the test when the rig's relay has stopped.
func (f *failoverRig) checkRunning(t *testing.T) {
	t.Helper()
	select {
	case <-f.rr.done:
		t.Fatalf("relay stopped: %v", f.rr.err)
	default:
	}
}

// checkDelivered waits until every message produced has arrived and checks
// first deliveries in commit order per partition, and that duplicates come
// only from the transactions after the replicated checkpoint (not only the
// rows pending there: rows of a transaction the relay had partly
// acknowledged are deleted while the position is not yet past it).
func (f *failoverRig) checkDelivered(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := f.v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	if d := f.v.Duplicates(); d > len(f.replayable) {
		t.Fatalf("%d duplicates, more than the %d rows after the replicated checkpoint", d, len(f.replayable))
	}
}

// failoverCount is the value of a COUNT(*) query.
func failoverCount(ctx context.Context, t *testing.T, db *sql.DB, q string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// A relay streaming under load; the replica catches up; the primary is
// killed while the relay still has a backlog and the replica promoted; the
// same relay process reconnects through the moved virtual IP and resumes from
// the replicated checkpoint (its in-memory position, from the old primary,
// is contained in the replica's GTID state: no refusal). Producers go on
// writing on the new primary. Every message arrives, first deliveries keep
// commit order per partition, and only rows of the transactions after the
// replicated checkpoint (the unacknowledged tail) may arrive twice.
func TestRelayFailoverToCaughtUpReplica(t *testing.T) {
	t.Parallel()
	f := newFailoverRig(t, false)
	ctx := testenv.WorkContext(t)
	waitFor(ctx, t, f.rr, "tailing", f.rr.r.Tailing)

	const total = 5_000
	produce(ctx, t, f.db, f.b, f.v, load{producers: 4, partitions: 40, total: total, bigTxn: 500, bigShare: 0.9})
	f.primary.WaitReplicaCaughtUp(t, f.replica)
	before := f.v.Received()
	if before >= total {
		t.Fatalf("the relay delivered everything (%d) before the failover: the test proved nothing", before)
	}
	rdb := f.failover(t)
	tail := failoverCount(ctx, t, rdb, "SELECT COUNT(*) FROM outbox")
	t.Logf("failover after %d of %d deliveries; %d rows pending on the promoted replica, %d after its checkpoint",
		before, total, tail, len(f.replayable))

	produce(ctx, t, &testenv.DB{SQL: rdb}, f.b, f.v, load{producers: 4, partitions: 40, total: 2_000, bigTxn: 50, bigShare: 0.5})
	f.checkDelivered(ctx, t)
	waitRows(ctx, t, &testenv.DB{SQL: rdb}, "SELECT COUNT(*) FROM outbox", 0)
	f.checkRunning(t)
}

// lostRows is how many rows lossyFailover writes that the replica never gets.
const lostRows = 300

// lossyFailover runs a relay against a primary whose replica stopped
// replicating before the last transactions, which the relay publishes and
// acknowledges; then the primary dies and the replica, behind, is promoted.
// It returns the rig and a pool on the new primary, with the relay's
// in-memory position newer than the replicated progress row.
func lossyFailover(ctx context.Context, t *testing.T, accept bool, tweak ...func(*Config)) (*failoverRig, *sql.DB) {
	t.Helper()
	f := lossyRig(ctx, t, accept, tweak...)
	return f, f.failover(t)
}

// lossyRig is lossyFailover up to the failover: the replica has stopped,
// and the relay has published and acknowledged lostRows rows it will never
// have.
func lossyRig(ctx context.Context, t *testing.T, accept bool, tweak ...func(*Config)) *failoverRig {
	t.Helper()
	f := stoppedReplicaRig(ctx, t, accept, tweak...)
	// The transactions the replica will never get: published and acknowledged.
	produce(ctx, t, f.db, f.b, f.v, load{producers: 2, partitions: 10, total: lostRows, bigTxn: 10, bigShare: 0.3})
	if err := f.v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, f.db, "SELECT COUNT(*) FROM outbox", 0)
	var stored string
	if err := f.db.SQL.QueryRowContext(ctx, "SELECT gtid_set FROM outbox_relay_progress WHERE relay_name = ?", relayNameFor(f.db.Name)).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, f.rr, "holding the acknowledged position", func() bool {
		published, _, err := f.rr.r.failover.published.newest()
		if err != nil {
			t.Fatal(err)
		}
		missing, err := position.Missing(position.FlavorMariaDB, published.GTIDSet,
			position.Position{Flavor: position.FlavorMariaDB, GTIDSet: stored})
		return err == nil && missing == ""
	})
	return f
}

// stoppedReplicaRig is a failover rig whose relay tails and has delivered
// some rows that the replica holds too; then the replica stops applying.
func stoppedReplicaRig(ctx context.Context, t *testing.T, accept bool, tweak ...func(*Config)) *failoverRig {
	t.Helper()
	f := newFailoverRig(t, accept, tweak...)
	f.stopReplica(ctx, t)
	return f
}

// stopReplica waits until the rig's relay tails, has it deliver some rows
// (all of them acknowledged) that the replica then catches up with, and
// stops the replica: it lacks whatever the primary commits from now on.
func (f *failoverRig) stopReplica(ctx context.Context, t *testing.T) {
	t.Helper()
	waitFor(ctx, t, f.rr, "tailing", f.rr.r.Tailing)
	produce(ctx, t, f.db, f.b, f.v, load{producers: 2, partitions: 10, total: 300, bigTxn: 10, bigShare: 0.3})
	if err := f.v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, f.db, "SELECT COUNT(*) FROM outbox", 0)
	f.primary.WaitReplicaCaughtUp(t, f.replica)
	if _, err := f.replica.Root(t).ExecContext(ctx, "STOP SLAVE"); err != nil {
		t.Fatalf("stop the replica: %v", err)
	}
}

// A lossy failover: the relay (the same process, which remembers a newer
// position than the replicated progress row) refuses to resume on the
// promoted replica and stops with a *LostGTIDsError naming the primary's
// transactions the replica lacks. Comparing the replicated row alone, or per
// domain only, would pass: the row is the replica's own, and the replica's
// next transactions reuse the lost sequence numbers under its own server id.
func TestRelayRefusesLossyFailover(t *testing.T) {
	t.Parallel()
	ctx := testenv.WorkContext(t)
	f, _ := lossyFailover(ctx, t, false)
	// The relay reconnects within seconds (its backoff is capped at 10 s);
	// a minute without stopping is a relay that resumed on the server.
	select {
	case <-f.rr.done:
	case <-time.After(time.Minute):
		t.Fatal("the relay kept running for a minute on a server that lacks what it published")
	}
	var lost *LostGTIDsError
	if !errors.As(f.rr.err, &lost) {
		t.Fatalf("Run returned %v, want a *LostGTIDsError", f.rr.err)
	}
	prefix := "0-" + strconv.FormatUint(uint64(f.primary.ServerID()), 10) + "-"
	if !strings.HasPrefix(lost.Missing, prefix) || !strings.Contains(lost.Error(), "Config.AcceptLostGTIDs") {
		t.Fatalf("error %q: want the missing GTIDs of the old primary (%s…) and the flag that accepts them", lost, prefix)
	}
	if !isFatal(f.rr.err) {
		t.Fatal("a lossy failover must stop the relay")
	}
	// Every row of the 300 written after the replica stopped was published
	// and is gone; the process remembers them all (fewer than recentLimit),
	// and none of the rows the replica has.
	distinct := map[outbox.MessageID]bool{}
	for _, id := range lost.MessageIDs {
		distinct[id] = true
	}
	if len(lost.MessageIDs) != lostRows || len(distinct) != lostRows {
		t.Fatalf("the error names %d message ids (%d distinct), want the %d of the lost rows", len(lost.MessageIDs), len(distinct), lostRows)
	}
	t.Logf("refused: %v", lost)
	f.rr.err = nil // the expected outcome: not an error of the cleanup's shutdown
}

// With AcceptLostGTIDs the relay resumes on the promoted replica from the
// server's own position and delivers everything written there afterwards.
func TestRelayAcceptsLostGTIDs(t *testing.T) {
	t.Parallel()
	ctx := testenv.WorkContext(t)
	f, rdb := lossyFailover(ctx, t, true)
	produce(ctx, t, &testenv.DB{SQL: rdb}, f.b, f.v, load{producers: 2, partitions: 10, total: 300, bigTxn: 10, bigShare: 0.3})
	if err := f.v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, &testenv.DB{SQL: rdb}, "SELECT COUNT(*) FROM outbox", 0)
	f.checkRunning(t)
}

// A failover to a replica with another gtid_domain_id: the promoted server
// writes in domain 1 while its GTID state keeps the old primary's domain 0,
// so the checkpoint becomes a two-domain set. The relay resumes through the
// moved virtual IP (its remembered domain-0 position is contained in the
// new server's state), then a fresh process, which knows only the
// two-domain row, resumes from it too. Every message arrives, in commit
// order per partition.
func TestRelayFailoverToReplicaWithOtherDomain(t *testing.T) {
	t.Parallel()
	f := newFailoverRig(t, false)
	ctx := testenv.WorkContext(t)
	waitFor(ctx, t, f.rr, "tailing", f.rr.r.Tailing)
	// Taken by the sessions the replica opens from now on: the ones after
	// its promotion (replicated transactions keep their own domain).
	if _, err := f.replica.Root(t).ExecContext(ctx, "SET GLOBAL gtid_domain_id = 1"); err != nil {
		t.Fatal(err)
	}

	produce(ctx, t, f.db, f.b, f.v, load{producers: 2, partitions: 20, total: 2_000, bigTxn: 50, bigShare: 0.5})
	f.primary.WaitReplicaCaughtUp(t, f.replica)
	rdb := f.failover(t)
	tail := failoverCount(ctx, t, rdb, "SELECT COUNT(*) FROM outbox")
	newDB := &testenv.DB{SQL: rdb, DSN: f.replica.DSN(f.db.Name), Name: f.db.Name}
	produce(ctx, t, newDB, f.b, f.v, load{producers: 2, partitions: 20, total: 2_000, bigTxn: 50, bigShare: 0.5})
	if err := f.v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, newDB, "SELECT COUNT(*) FROM outbox", 0)

	// The stored checkpoint now spans both domains. It may not be stored
	// yet (positions are written every CheckpointInterval, and a busy
	// machine may have killed the primary before its relay wrote one): no
	// set yet counts as no domain.
	var stored string
	domains := func() int {
		var set sql.NullString
		if err := rdb.QueryRowContext(ctx, "SELECT gtid_set FROM outbox_relay_progress WHERE relay_name = ?",
			relayNameFor(f.db.Name)).Scan(&set); err != nil {
			t.Fatalf("the stored checkpoint: %v", err)
		}
		if !set.Valid {
			return 0
		}
		stored = set.String
		if _, err := position.ParseGTIDSet(position.FlavorMariaDB, stored); err != nil {
			t.Fatalf("stored gtid_set %q: %v", stored, err)
		}
		seen := map[string]bool{}
		for _, g := range strings.Split(stored, ",") {
			seen[strings.TrimSpace(g[:strings.IndexByte(g, '-')+1])] = true
		}
		return len(seen)
	}
	waitFor(ctx, t, f.rr, "a two-domain checkpoint", func() bool { return domains() == 2 })
	if !strings.Contains(stored, "1-"+strconv.FormatUint(uint64(f.replica.ServerID()), 10)+"-") {
		t.Fatalf("stored checkpoint %q has no domain-1 GTID of the promoted server", stored)
	}
	if err := f.rr.stop(); err != nil {
		t.Fatalf("first relay: %v", err)
	}

	// A fresh process: it knows only the replicated two-domain row.
	rr := runRelay(t, Config{MySQLDSN: newDB.DSN, AMQPURL: f.b.URL, DefaultExchange: f.b.Exchange,
		CheckpointInterval: time.Second, HeartbeatInterval: 500 * time.Millisecond}, nil)
	waitFor(ctx, t, rr, "tailing", rr.r.Tailing)
	produce(ctx, t, newDB, f.b, f.v, load{producers: 2, partitions: 20, total: 1_000, bigTxn: 50, bigShare: 0.5})
	// The clean stop and the fresh start repeat nothing.
	f.checkDelivered(ctx, t)
	t.Logf("checkpoint after the failover: %s; %d rows pending and %d rows after the replicated checkpoint at the failover; %d duplicates",
		stored, tail, len(f.replayable), f.v.Duplicates())
}

// A lossy failover seen by processes started fresh against the promoted
// replica. Without a state file such a process knows only the replicated
// progress row, which the replica has, so it resumes (the documented
// limit). With the --state-file the old process kept, it refuses as the old
// process does, naming the file.
func TestRelayStateFileCatchesLossyFailoverAfterRestart(t *testing.T) {
	t.Parallel()
	ctx := testenv.WorkContext(t)
	state := filepath.Join(t.TempDir(), "relay-state.json")
	f, _ := lossyFailover(ctx, t, false, func(c *Config) { c.StateFile = state })
	// The old process notices on its own reconnection (as in
	// TestRelayRefusesLossyFailover); stop waiting for it either way.
	select {
	case <-f.rr.done:
	case <-time.After(time.Minute):
		t.Fatal("the old relay kept running on a server that lacks what it published")
	}
	f.rr.err = nil
	saved, err := os.ReadFile(state)
	if err != nil {
		t.Fatalf("the state file: %v", err)
	}

	fresh := func(stateFile string) *relayRun {
		return runRelay(t, Config{MySQLDSN: f.replica.DSN(f.db.Name), AMQPURL: f.b.URL, DefaultExchange: f.b.Exchange,
			HeartbeatInterval: 500 * time.Millisecond, StateFile: stateFile}, nil)
	}
	withFile := fresh(state)
	select {
	case <-withFile.done:
	case <-time.After(time.Minute):
		t.Fatalf("a fresh relay with the state file (%s) resumed on a server that lacks what it published", saved)
	}
	var lost *LostGTIDsError
	if !errors.As(withFile.err, &lost) || !strings.Contains(lost.Error(), "Config.StateFile "+state) {
		t.Fatalf("fresh relay with the state file: %v, want a *LostGTIDsError naming the file", withFile.err)
	}
	withFile.err = nil
	t.Logf("refused with the state file: %v", lost.Missing)

	// Without it the same start is not caught: the row is the replica's own.
	without := fresh("")
	waitFor(ctx, t, without, "tailing without a state file", without.r.Tailing)
}
