package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/metrics"
)

// clusterTotal and clusterKeys are each fault's load: 4,000 messages (at least)
// over 200 partition keys from concurrent producers. The fault comes after
// 1,000 are confirmed.
const clusterTotal, clusterKeys = 4_000, 200

// The relay publishes into a quorum queue (and a classic queue bound to the
// same exchange) on a three-node RabbitMQ cluster, given every node's URL,
// while clusterTotal messages (or more) over 200 keys are written, and a fault hits the
// cluster mid-stream. After each, both queues hold every message, first
// deliveries in commit order per key, duplicated messages no more than those
// unconfirmed at the fault (a confirm window per lane and per fault), and
// nothing went to outbox_failed. A last fault does the same to the stream
// destination (streamLeaderKilled: exactly once). The faults run one after
// the other on one cluster (starting three nodes takes tens of seconds),
// which is whole again before each.
//
// It runs in parallel with the package's other parallel tests (after the
// serial ones), under a relay name of its own: its two minutes, mostly
// waiting for the cluster, overlap theirs.
func TestRelayOnCluster(t *testing.T) {
	t.Parallel()
	c := testenv.SharedRabbitCluster(t)

	// a. The node the relay is connected to is killed (SIGKILL), and
	// started again once the relay has moved to another node.
	t.Run("connected_node_killed", func(t *testing.T) {
		r := startClusterRun(t, c, 2, []int{0, 1, 2})
		ctx := testenv.WorkContext(t)
		load := r.produce(ctx, 0)
		r.waitPublished(ctx, 1_000)
		node := r.connectedNode(t)
		c.Node(node).Kill(t)
		t.Logf("killed node %d, the relay's, after %v messages were confirmed", node, r.published(t))
		r.waitMoved(ctx, node)
		c.Node(node).Start(t)
		r.finish(ctx, load, 1, true)
	})

	// b. The node leading the quorum queue is killed while messages are in
	// flight: a leader election under the relay's feet, its own connection
	// (to another node) staying up.
	t.Run("quorum_leader_killed", func(t *testing.T) {
		r := startClusterRun(t, c, 2, []int{1, 2, 0})
		ctx := testenv.WorkContext(t)
		leader := c.QuorumLeader(t, r.b.Quorum)
		load := r.produce(ctx, 0)
		r.waitPublished(ctx, 1_000)
		if node := r.connectedNode(t); node == leader {
			t.Fatalf("the relay is connected to node %d, the leader: this would repeat the first fault", node)
		}
		c.Node(leader).Kill(t)
		t.Logf("killed node %d, the quorum queue's leader, after %v messages were confirmed", leader, r.published(t))
		c.Node(leader).Start(t)
		r.finish(ctx, load, 1, true)
	})

	// c. Two of the three nodes are down for 20 s: the quorum queue has no
	// majority and confirms nothing. The relay stays connected to the
	// third, gives up no message, holds what it read within its memory
	// bound, says so on readiness, and resumes by itself.
	t.Run("majority_lost", func(t *testing.T) {
		r := startClusterRun(t, c, 0, []int{0, 1, 2})
		ctx := testenv.WorkContext(t)
		load := r.produce(ctx, 0)
		r.waitPublished(ctx, 1_000)
		if node := r.connectedNode(t); node != 0 {
			t.Fatalf("the relay is connected to node %d, want 0", node)
		}
		c.Node(1).Kill(t)
		c.Node(2).Kill(t)
		down := time.Now()
		atFault := r.published(t)
		t.Logf("killed nodes 1 and 2 after %v messages were confirmed", atFault)
		// Readiness says confirms stopped, naming the node.
		if err := pollUntil(ctx, func() bool {
			err := r.relay.Ready()
			return err != nil && strings.Contains(err.Error(), "no publisher confirms") && strings.Contains(err.Error(), c.Node(0).Addr())
		}); err != nil {
			t.Fatalf("readiness never said that confirms stopped: %v (last: %v)", err, r.relay.Ready())
		}
		t.Logf("not ready after %v: %v", time.Since(down).Round(time.Millisecond), r.relay.Ready())
		// The outage's length is the point here, not a condition.
		time.Sleep(20*time.Second - time.Since(down))
		confirmed := r.published(t) - atFault
		inflight := metricValue(t, r.reg, "outbox_relay_inflight_bytes")
		failed := count(ctx, t, r.db.SQL, "SELECT COUNT(*) FROM outbox_failed")
		t.Logf("after 20 s without a majority: %v messages confirmed meanwhile, %v bytes in flight, %d rows failed", confirmed, inflight, failed)
		if failed != 0 {
			t.Errorf("%d messages given up as failed while the quorum queue had no majority", failed)
		}
		if limit := float64(r.cfg.MaxInflightBytes); inflight > limit {
			t.Errorf("%v bytes in flight, above --max-inflight-bytes %v", inflight, limit)
		}
		if r.relay.Ready() == nil {
			t.Error("ready after 20 s without confirms")
		}
		// status (the progress row) names the node and the stall.
		if b := r.brokerStatus(ctx); b == nil || b.Node != c.Node(0).Addr() || b.Stalled == nil || b.Stalled.Seconds < 10 {
			t.Errorf("progress row after 20 s without confirms: broker %+v, want node %s stalled for 10 s or more", b, c.Node(0).Addr())
		} else {
			t.Logf("progress row: broker %s, confirms stalled since %v (%.1f s)", b.Node, b.Stalled.Since, b.Stalled.Seconds)
		}
		c.Restore(t)
		t.Logf("majority back after %v", time.Since(down).Round(time.Millisecond))
		if err := pollUntil(ctx, func() bool { return r.relay.Ready() == nil }); err != nil {
			t.Fatalf("not ready again after the majority came back: %v", r.relay.Ready())
		}
		var b *operator.BrokerState
		if err := pollUntil(ctx, func() bool { b = r.brokerStatus(ctx); return b != nil && b.Stalled == nil }); err != nil {
			t.Fatalf("the progress row still shows no node or confirms stalled after the majority came back: %+v: %v", b, err)
		}
		r.finish(ctx, load, 1, true)
	})

	// d. A rolling restart: each node in turn is stopped cleanly and started
	// again, the next one once the cluster is whole, while producers write
	// at a steady pace.
	t.Run("rolling_restart", func(t *testing.T) {
		r := startClusterRun(t, c, 2, []int{0, 1, 2})
		ctx := testenv.WorkContext(t)
		// The producers write until the last node is back: however long
		// a restart takes, each one happens under load.
		restarted := make(chan struct{})
		// At this pace (about 50 messages a second) a restart of a minute
		// costs 3,000 messages; the load is at least 1,000 (the other
		// faults' clusterTotal would take 80 s at this pace).
		load := r.produceUntil(ctx, 500*time.Millisecond, 1_000, restarted)
		r.waitPublished(ctx, 300)
		for i := range testenv.ClusterSize {
			began, before := time.Now(), r.published(t)
			c.Node(i).Stop(t)
			c.Restore(t)
			// The relay confirms messages while the node restarts (or right
			// after): a restart never stalls it for good.
			if err := pollUntil(ctx, func() bool { return r.published(t) > before }); err != nil {
				t.Fatalf("no message confirmed since node %d was stopped (%v confirmed): %v", i, before, err)
			}
			t.Logf("node %d restarted in %v; %v messages confirmed so far", i, time.Since(began).Round(time.Millisecond), r.published(t))
		}
		close(restarted)
		// The classic queue's node was down too: what the exchange
		// routed meanwhile never reached that queue, and the broker still
		// confirmed it (the quorum queue took it). That is RabbitMQ's
		// promise for a classic queue, not the relay's to keep.
		r.finish(ctx, load, testenv.ClusterSize, false)
	})

	// e. The stream destination, given every node's stream URL: the node
	// leading partition stream 0 is killed mid-stream.
	t.Run("stream_leader_killed", func(t *testing.T) { streamLeaderKilled(t, c) })
}

// clusterRun is one fault's relay, database, exchange and queues.
type clusterRun struct {
	t     *testing.T
	c     *testenv.RabbitCluster
	b     *testenv.ClusterBroker
	db    *testenv.DB
	reg   *prometheus.Registry
	cfg   Config
	relay *Relay
	v     *validator.Validator // expectations; the quorum queue's deliveries
	// stuckCloses holds the relay's warnings (a connection closed for
	// stuck confirms among them).
	stuckCloses *observer.ObservedLogs
}

// startClusterRun starts a relay given the nodes' URLs in the order of
// nodes, with the classic queue on node classicNode.
func startClusterRun(t *testing.T, c *testenv.RabbitCluster, classicNode int, nodes []int) *clusterRun {
	t.Helper()
	db := testenv.MySQL(t)
	db.Migrate(testenv.Context(t, time.Minute), t)
	r := &clusterRun{t: t, c: c, b: c.Broker(t, classicNode), db: db, v: validator.New()}
	reg, m, err := metrics.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	r.reg = reg
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = c.Node(n).URL()
	}
	core, logs := observer.New(zap.WarnLevel)
	r.stuckCloses = logs
	rel, _ := startRelayR(t, db, &testenv.Broker{URL: strings.Join(urls, ","), Exchange: r.b.Exchange}, func(cfg *Config) {
		cfg.Metrics = m
		cfg.Logger = zap.New(zapcore.NewTee(cfg.Logger.Core(), core))
		r.cfg = *cfg
	})
	r.relay = rel
	r.cfg.MaxInflightBytes = rel.cfg.MaxInflightBytes
	r.cfg.Lanes, r.cfg.ConfirmWindow = rel.cfg.Lanes, rel.cfg.ConfirmWindow
	return r
}

// brokerStatus is what the progress row (status) says of the broker.
func (r *clusterRun) brokerStatus(ctx context.Context) *operator.BrokerState {
	r.t.Helper()
	rows, err := operator.ReadStatus(ctx, r.db.SQL, r.cfg.RelayName, time.Minute)
	if err != nil {
		r.t.Fatalf("read status: %v", err)
	}
	return rows[0].Broker
}

// produce writes clusterTotal messages in the background; the channel gets
// its end. With pace 0 it is written as fast as it goes, one transaction in
// five of 100 rows; with a pace, one in fifty, each producer pausing pace
// after each transaction.
func (r *clusterRun) produce(ctx context.Context, pace time.Duration) <-chan error {
	return r.produceUntil(ctx, pace, clusterTotal, nil)
}

// produceUntil is produce of total messages, going on past them until until
// is closed (nil: it is not waited for).
func (r *clusterRun) produceUntil(ctx context.Context, pace time.Duration, total int, until <-chan struct{}) <-chan error {
	bigShare := 0.2
	if pace > 0 {
		bigShare = 0.02
	}
	done := make(chan error, 1)
	go func() {
		done <- testload.Run(ctx, r.db.SQL, r.v, testload.Load{
			Producers: 8, Partitions: clusterKeys, Total: total, BigTxn: 100, BigShare: bigShare,
			Exchange: r.b.Exchange, Pace: pace, Until: until,
		})
	}()
	return done
}

// published is outbox_relay_published_total: messages the broker confirmed.
func (r *clusterRun) published(t *testing.T) float64 {
	return counterValue(t, r.reg, "outbox_relay_published_total")
}

// waitPublished waits until the broker confirmed n messages, and fails when
// by then every message was: the fault would come after the stream.
func (r *clusterRun) waitPublished(ctx context.Context, n float64) {
	r.t.Helper()
	if err := pollWhile(ctx, func() float64 { return r.published(r.t) }, func() bool { return r.published(r.t) >= n }); err != nil {
		r.t.Fatalf("only %v messages confirmed, waited for %v: %v", r.published(r.t), n, err)
	}
	if p := r.published(r.t); p >= clusterTotal {
		r.t.Fatalf("all %v messages were confirmed before the fault: it would prove nothing", p)
	}
}

// connectedNode is the node the relay publishes to.
func (r *clusterRun) connectedNode(t *testing.T) int {
	t.Helper()
	addr := r.relay.BrokerNode()
	i := r.c.NodeAt(addr)
	if i < 0 {
		t.Fatalf("the relay is connected to %q, not a node of the cluster", addr)
	}
	return i
}

// waitMoved waits until the relay is connected to a node other than from.
func (r *clusterRun) waitMoved(ctx context.Context, from int) {
	r.t.Helper()
	began := time.Now()
	if err := pollUntil(ctx, func() bool {
		i := r.c.NodeAt(r.relay.BrokerNode())
		return i >= 0 && i != from
	}); err != nil {
		r.t.Fatalf("the relay did not connect to another node: %v", err)
	}
	r.t.Logf("the relay moved to node %d in %v", r.connectedNode(r.t), time.Since(began).Round(time.Millisecond))
}

// finish waits for the load and for the cluster to be whole, then reads
// both queues and checks them: every message, first deliveries in order per
// key, the outbox empty and nothing failed, and at most a confirm window per
// lane per fault (faults) of messages duplicated: only a message unconfirmed
// at a fault may be published again. (A message may arrive more than twice
// in a queue that took it while another refused it: each nack of the
// quorum queue during an election republishes it.) Without classicWhole
// (the classic queue's node was down during the run) the classic queue is
// only counted.
func (r *clusterRun) finish(ctx context.Context, load <-chan error, faults int, classicWhole bool) {
	t := r.t
	t.Helper()
	var loadErr error
	finished := func() bool {
		select {
		case loadErr = <-load:
			return true
		default:
			return false
		}
	}
	if err := progress.Wait(ctx, "wait for the producers", func() int64 { return int64(r.v.ExpectedCount()) }, finished); err != nil {
		t.Fatalf("the producers did not finish (%d messages written): %v", r.v.ExpectedCount(), err)
	}
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	r.c.Restore(t)
	vc := r.v.Clone()
	for _, q := range []struct {
		name string
		v    *validator.Validator
	}{{r.b.Quorum, r.v}, {r.b.Classic, vc}} {
		stop, err := validator.Consume(context.Background(), r.c.Node(r.b.ClassicNode).URL(), q.name, q.v)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	waitRows(ctx, t, r.db, "SELECT COUNT(*) FROM outbox", 0)
	if n := count(ctx, t, r.db.SQL, "SELECT COUNT(*) FROM outbox_failed"); n != 0 {
		t.Errorf("%d messages went to outbox_failed", n)
	}
	// A connection the relay closed for stuck confirms
	// (publish.Config.ConfirmStuckAfter) publishes its unconfirmed
	// messages again too: each counts as a fault.
	if n := r.stuckCloses.FilterMessageSnippet("no publisher confirms for a while").Len(); n > 0 {
		t.Logf("the relay closed %d connections whose confirms were stuck", n)
		faults += n
	}
	bound := faults * r.cfg.Lanes * r.cfg.ConfirmWindow
	for _, q := range []struct {
		kind string
		v    *validator.Validator
	}{{"quorum", r.v}, {"classic", vc}} {
		if q.v == vc && !classicWhole {
			// The quorum queue's check has waited for the deliveries.
			t.Logf("classic queue, its node restarted under load: %d of %d messages (%d routed while it was down are not there)",
				vc.Received()-vc.Duplicates(), vc.ExpectedCount(), vc.Missing())
			continue
		}
		if err := q.v.WaitComplete(ctx); err != nil {
			t.Errorf("%s queue: %v", q.kind, err)
			continue
		}
		if err := q.v.Check(validator.AtLeastOnce); err != nil {
			t.Errorf("%s queue: %v", q.kind, err)
		}
		dup := q.v.DuplicatedMessages()
		t.Logf("%s queue: all %d messages; %d duplicated, %d extra deliveries (bound %d messages: %d faults × %d lanes × window %d)",
			q.kind, q.v.ExpectedCount(), dup, q.v.Duplicates(), bound, faults, r.cfg.Lanes, r.cfg.ConfirmWindow)
		if dup > bound {
			t.Errorf("%s queue: %d messages duplicated, more than the %d that can be unconfirmed at the faults", q.kind, dup, bound)
		}
	}
}
