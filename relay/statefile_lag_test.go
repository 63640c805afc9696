package relay

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/position"
)

// stallTxns is how many transactions the primary commits, and the relay
// publishes, while its acknowledgements hang.
const stallTxns = 20

// The state file follows what was sent, not what was acknowledged. The
// relay's pool goes through one proxy, its binlog stream through another;
// the replica stops; the pool's proxy stalls (acknowledgements, heartbeats
// and every other statement hang, as on a database that stopped answering)
// while the binlog flows: the primary commits stallTxns transactions, the
// relay publishes them and a consumer receives them, one after the other
// (the first acknowledgement to hang does so early on). Within a hundred
// ackGaps the state file must hold them. The file as it is then is what a
// SIGKILL of the process would leave (it is replaced by a rename): a copy of
// it is taken. The primary dies and the replica, which lacks those
// transactions, is promoted behind both proxies; the old process refuses
// on its own. A process started fresh with the copy against the promoted
// replica must refuse too, naming the missing transactions and the file.
func TestRelayStateFileFollowsSentWhileAcksStall(t *testing.T) {
	t.Parallel()
	ctx := testenv.WorkContext(t)
	state := filepath.Join(t.TempDir(), "relay-state.json")
	f := stalledAckRig(t, state)
	f.stopReplica(ctx, t)

	f.vip.Stall() // the pool's proxy: acknowledgements hang from now on
	// One transaction at a time, each received before the next commits:
	// the first acknowledgement that hangs does so while most of them are
	// still to be sent.
	before := f.v.Received()
	var last string
	for i := range stallTxns {
		last = commitOneKeyTxn(ctx, t, f, 5)
		waitReceived(ctx, t, f.v, before+5*(i+1))
	}
	killed := killedStateFile(t, f.rr, state, last)

	f.primary.Kill(t)
	f.replica.Promote(t)
	f.vip.Retarget(f.replica.Addr())
	f.binlogVIP.Retarget(f.replica.Addr())
	f.vip.Unstall()
	waitLost(t, f.rr, "the relay whose acknowledgements hung")

	fresh := runRelay(t, Config{MySQLDSN: f.replica.DSN(f.db.Name), AMQPURL: f.b.URL, DefaultExchange: f.b.Exchange,
		HeartbeatInterval: 500 * time.Millisecond, StateFile: killed}, nil)
	lost := waitLost(t, fresh, "a relay started with the state file a kill left")
	if !strings.HasSuffix(lost.Missing, last) || !strings.Contains(lost.Error(), "Config.StateFile "+killed) {
		t.Fatalf("refusal %q: want the transactions sent while acknowledgements hung (up to %s) missing, read from the state file",
			lost.Error(), last)
	}
	t.Logf("refused: %s missing, %s", lost.Missing, lost.From)
}

// stalledAckRig is a failoverRig whose relay, with state as its
// Config.StateFile, reaches the database through vip and reads the binlog
// through binlogVIP, two proxies in front of the primary.
func stalledAckRig(t *testing.T, state string) *failoverRig {
	t.Helper()
	primary, db, b := privateSetup(t)
	f := &failoverRig{primary: primary, replica: primary.StartReplica(t), db: db, b: b}
	f.vip, f.binlogVIP = testenv.Proxy(t, primary.Addr()), testenv.Proxy(t, primary.Addr())
	f.v = consume(t, b, b.Queue)
	f.rr = f.runViaProxies(t, Config{
		AMQPURL: b.URL, DefaultExchange: b.Exchange, StateFile: state,
		// A heartbeat that hangs ends the term after twice this, at most
		// three times this after the stall begins, and the term's end
		// writes the state file: the kill must come, and the file follow,
		// before.
		CheckpointInterval: time.Second, HeartbeatInterval: 5 * time.Second,
	})
	return f
}

// killedStateFile waits, at most a hundred times the state file's promised
// interval (ackGap), until the state file holds the transaction gtid while
// rr's term still runs (the end of a term writes the file too: a SIGKILL
// does not), and returns a copy of the file as it is then: what a SIGKILL
// of the process at that moment would leave. A file that does not get
// there fails the test, which goes on with the copy as it is.
func killedStateFile(t *testing.T, rr *relayRun, state, gtid string) string {
	t.Helper()
	file := &stateFile{path: state, relayName: rr.r.cfg.RelayName}
	var saved position.Position
	termEnded := false
	err := progress.WaitPatience(context.Background(), 100*ackGap, "the state file holds "+gtid, nil, func() bool {
		var err error
		if saved, err = file.load(); err != nil {
			t.Fatalf("the state file: %v", err)
		}
		missing, err := position.Missing(position.FlavorMariaDB, saved.GTIDSet, position.Position{Flavor: position.FlavorMariaDB, GTIDSet: gtid})
		termEnded = !rr.r.Tailing() // read after the file: the term ran when it was written
		return termEnded || err == nil && missing == "" && saved.GTIDSet != ""
	})
	if err != nil || termEnded {
		t.Errorf("while acknowledgements hang, the state file holds %q, not the transaction %s the relay sent (the term ended: %v): %v",
			saved.GTIDSet, gtid, termEnded, err)
	}
	data, err := os.ReadFile(state)
	if err != nil {
		t.Fatalf("the state file: %v", err)
	}
	killed := filepath.Join(filepath.Dir(state), "killed-state.json")
	if err := os.WriteFile(killed, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return killed
}

// runViaProxies runs a relay of cfg on f.db through the rig's proxies: its
// pool through f.vip, its binlog connection through f.binlogVIP.
func (f *failoverRig) runViaProxies(t *testing.T, cfg Config) *relayRun {
	t.Helper()
	dsn, err := mysql.ParseDSN(f.db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	dsn.Addr = f.vip.Addr()
	cfg.MySQLDSN = dsn.FormatDSN()
	host, port, err := net.SplitHostPort(f.binlogVIP.Addr())
	if err != nil {
		t.Fatal(err)
	}
	binlogPort, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return runRelay(t, cfg, func(r *Relay) { r.canal.Host, r.canal.Port = host, binlogPort })
}
