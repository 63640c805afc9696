package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// bigTxnRows is the size of the one-key transaction the partly-published
// failover test loses: at one confirm round trip per message (one key, so
// one message on the wire at a time) it takes the relay a second or more,
// far longer than the acknowledged position needs to stay behind it.
const bigTxnRows = 3_000

// A transaction counts as published once any of its messages was sent, not
// once its position is acknowledged. The replica stops; the primary commits
// one transaction of bigTxnRows rows of one partition key; as soon as a
// consumer holds one of its messages the primary is killed and the replica,
// which never got that transaction, is promoted behind the same address.
// The relay must refuse with a *LostGTIDsError naming that transaction's
// GTID and how many of its messages went out, in --mode auto (where a
// purged-looking stream would otherwise send it to poll mode) and --mode
// binlog. Comparing the acknowledged position alone passes: it is before
// the transaction, and the replica has it. A process started fresh with
// the same --state-file refuses too.
func TestRelayRefusesFailoverLosingPartlyPublishedTxn(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{ModeAuto, ModeBinlog} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testenv.WorkContext(t)
			state := filepath.Join(t.TempDir(), "relay-state.json")
			f := stoppedReplicaRig(ctx, t, false, func(c *Config) { c.Mode = mode; c.StateFile = state })
			before := f.v.Received()

			gtid := commitOneKeyTxn(ctx, t, f, bigTxnRows)
			waitReceived(ctx, t, f.v, before+1)
			f.failover(t)

			lost := waitLost(t, f.rr, "the relay that published part of "+gtid)
			if !strings.Contains(lost.Missing, gtid) && !strings.HasSuffix(lost.Missing, ".."+gtid) {
				t.Fatalf("refusal names missing %q, want the transaction %s", lost.Missing, gtid)
			}
			if len(lost.Transactions) != 1 || lost.Transactions[0] != gtid || lost.Sent < 1 || lost.Sent > bigTxnRows ||
				len(lost.MessageIDs) != lost.Sent {
				t.Fatalf("refusal names transactions %v with %d messages sent (%d ids), want %s with 1..%d",
					lost.Transactions, lost.Sent, len(lost.MessageIDs), gtid, bigTxnRows)
			}
			if msg := lost.Error(); !strings.Contains(msg, gtid) || !strings.Contains(msg, strconv.Itoa(lost.Sent)+" messages") {
				t.Fatalf("refusal %q does not name the transaction and the messages sent", msg)
			}
			t.Logf("refused after %d of %d messages of %s were sent: %s", lost.Sent, bigTxnRows, gtid, lost.Missing)
			rdb, err := sql.Open("mysql", f.replica.DSN(f.db.Name))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.Close() })
			wantFailed(ctx, t, rdb, relayNameFor(f.db.Name), "lossy failover", gtid)

			fresh := runRelay(t, Config{MySQLDSN: f.replica.DSN(f.db.Name), AMQPURL: f.b.URL, DefaultExchange: f.b.Exchange,
				HeartbeatInterval: 500 * time.Millisecond, StateFile: state, Mode: mode}, nil)
			again := waitLost(t, fresh, "a fresh relay with the state file")
			if !strings.Contains(again.Missing, gtid) && !strings.HasSuffix(again.Missing, ".."+gtid) {
				t.Fatalf("fresh relay refused with missing %q, want the transaction %s", again.Missing, gtid)
			}
			wantFailed(ctx, t, rdb, relayNameFor(f.db.Name), "lossy failover", gtid)

			// The operator accepts the loss: that term delivers and
			// clears FAILED.
			accepted := runRelay(t, Config{MySQLDSN: f.replica.DSN(f.db.Name), AMQPURL: f.b.URL, DefaultExchange: f.b.Exchange,
				HeartbeatInterval: 500 * time.Millisecond, StateFile: state, Mode: mode, AcceptLostGTIDs: true}, nil)
			waitFor(ctx, t, accepted, "tailing after accepting the loss", accepted.r.Tailing)
			wantActive(ctx, t, rdb, relayNameFor(f.db.Name))
		})
	}
}

// A lossy failover to a replica whose binlog the preflight refuses
// (binlog_row_metadata is not replicated, and MariaDB's default is not FULL):
// an auto relay must not start a poll term that publishes on; it refuses as
// it does in binlog mode.
func TestRelayAutoRefusesLossyFailoverToUnreadableBinlog(t *testing.T) {
	t.Parallel()
	ctx := testenv.WorkContext(t)
	f := lossyRig(ctx, t, false)
	if _, err := f.replica.Root(t).ExecContext(ctx, "SET GLOBAL binlog_row_metadata = MINIMAL"); err != nil {
		t.Fatal(err)
	}
	f.failover(t)
	lost := waitLost(t, f.rr, "an auto relay failing over to a replica without row metadata")
	if !strings.Contains(lost.Missing, "0-"+strconv.FormatUint(uint64(f.primary.ServerID()), 10)+"-") {
		t.Fatalf("refusal names missing %q, want the old primary's transactions", lost.Missing)
	}
}

// commitOneKeyTxn commits one transaction of n messages of one partition
// key on the rig's primary and returns its GTID.
func commitOneKeyTxn(ctx context.Context, t *testing.T, f *failoverRig, n int) string {
	t.Helper()
	conn, err := f.db.SQL.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{PartitionKey: "big-txn", Exchange: f.b.Exchange, RoutingKey: "rk.big-txn",
			Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
	}
	if _, err := outbox.Enqueue(ctx, tx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var gtid string
	if err := conn.QueryRowContext(ctx, "SELECT @@last_gtid").Scan(&gtid); err != nil {
		t.Fatal(err)
	}
	return gtid
}

// waitLost waits (a minute at most) for rr to stop with a *LostGTIDsError
// and returns it; the refusal is then no error of the test's cleanup.
func waitLost(t *testing.T, rr *relayRun, who string) *LostGTIDsError {
	t.Helper()
	select {
	case <-rr.done:
	case <-time.After(time.Minute):
		t.Fatalf("%s kept running for a minute on a server that lacks what it published", who)
	}
	var lost *LostGTIDsError
	if !errors.As(rr.err, &lost) {
		t.Fatalf("%s: Run returned %v, want a *LostGTIDsError", who, rr.err)
	}
	if !isFatal(rr.err) {
		t.Fatalf("%s: a lossy failover must stop the relay", who)
	}
	rr.err = nil
	return lost
}
