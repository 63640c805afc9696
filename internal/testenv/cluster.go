package testenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/progress"
)

// ClusterSize is the number of nodes of a RabbitCluster: the smallest
// cluster that keeps a quorum (two) with one node down.
const ClusterSize = 3

// clusterSettleTimeout bounds the wait for a cluster to be whole again (every
// node running, every member of a quorum queue online, a leader elected):
// generous, so that only a cluster that is stuck fails it.
const clusterSettleTimeout = progress.Patience

// ctlPollInterval is the pause between two conditions asked of rabbitmqctl.
// Each call starts an Erlang VM (about a second of CPU): asked back to back,
// they take a core from the nodes being waited on (the suite's whole
// RabbitMQ CLI time was over a minute of CPU).
const ctlPollInterval = 2 * time.Second

// RabbitCluster is a private cluster of ClusterSize RabbitMQ nodes on this
// machine: private nodes (see RabbitNode) with a shared Erlang cookie,
// joined to the first node by peer discovery as they first boot, each with
// the stream plugin (StreamURL). Quorum queues and streams declared on it
// have a member on every node.
//
// Starting one takes tens of seconds, so a test binary has one
// (SharedRabbitCluster), used by its tests one after the other: a test that
// stops or kills nodes restores the cluster before it ends (Restore).
type RabbitCluster struct {
	nodes []*RabbitNode
}

// SharedRabbitCluster returns this test binary's cluster, started on first
// use and destroyed by Main after the tests. Tests using it must not run in
// parallel with each other (they stop and kill its nodes); each starts with
// the cluster whole. When rabbitmq-server is not installed the test is
// skipped, or fails under Require.
func SharedRabbitCluster(t testing.TB) *RabbitCluster {
	t.Helper()
	if !shared.main.Load() {
		t.Fatalf("testenv: SharedRabbitCluster needs the package's TestMain to run the tests through testenv.Main, which stops the cluster")
	}
	shared.clusterOnce.Do(func() {
		began := time.Now()
		shared.cluster, shared.clusterErr = newRabbitCluster()
		if shared.clusterErr == nil {
			fmt.Fprintf(os.Stderr, "testenv: RabbitMQ cluster of %d nodes up in %v\n", ClusterSize, time.Since(began).Round(time.Millisecond))
		}
	})
	if shared.clusterErr != nil {
		if errors.Is(shared.clusterErr, errMissing) {
			unavailable(t, "cannot start a private RabbitMQ cluster: %v", shared.clusterErr)
		}
		t.Fatalf("testenv: start the RabbitMQ cluster: %v", shared.clusterErr)
	}
	c := shared.cluster
	if c == nil {
		t.Fatalf("testenv: SharedRabbitCluster called after testenv.Main finished the tests")
	}
	c.Restore(t)
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.nodes {
				t.Logf("testenv: tail of the log of RabbitMQ node %s:\n%s", n.name, n.logTail())
			}
		}
	})
	return c
}

// newRabbitCluster starts the first node, then the others at once, each
// joining the first as it boots (peer discovery from its configuration): no
// node starts its application twice, and no rabbitmqctl runs. Started all
// at once, two fresh nodes could each form a cluster of their own.
func newRabbitCluster() (_ *RabbitCluster, err error) {
	cookie := fmt.Sprintf("OUTBOXCLUSTER%016X", rand.Uint64())
	c := &RabbitCluster{nodes: make([]*RabbitNode, ClusterSize)}
	defer func() {
		if err != nil {
			_ = c.destroy()
		}
	}()
	if c.nodes[0], err = newRabbitNode(rabbitOptions{cookie: cookie, streams: true}); err != nil {
		return c, err
	}
	first := c.nodes[0].name
	errs := make([]error, ClusterSize)
	var wg sync.WaitGroup
	for i := 1; i < ClusterSize; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.nodes[i], errs[i] = newRabbitNode(rabbitOptions{cookie: cookie, peers: []string{first}, streams: true})
			if errs[i] != nil {
				errs[i] = fmt.Errorf("join node %d to %s: %w", i, first, errs[i])
			}
		}()
	}
	wg.Wait()
	return c, errors.Join(errs...)
}

// destroy kills every node and removes their directories.
func (c *RabbitCluster) destroy() error {
	var errs []error
	for _, n := range c.nodes {
		if n != nil {
			errs = append(errs, n.destroy())
		}
	}
	return errors.Join(errs...)
}

// Nodes returns the cluster's nodes; their order never changes.
func (c *RabbitCluster) Nodes() []*RabbitNode { return c.nodes }

// Node returns node i (0 ≤ i < ClusterSize).
func (c *RabbitCluster) Node(i int) *RabbitNode { return c.nodes[i] }

// URLs returns the AMQP URLs of the nodes, comma-separated, in node order:
// the --amqp-url of a relay that may use any node.
func (c *RabbitCluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.URL()
	}
	return strings.Join(urls, ",")
}

// NodeAt returns the index of the node whose AMQP listener is addr
// (host:port), -1 when none.
func (c *RabbitCluster) NodeAt(addr string) int {
	for i, n := range c.nodes {
		if n.Addr() == addr {
			return i
		}
	}
	return -1
}

// Restore starts every node that is not running and waits until the cluster
// is whole: each node accepts AMQP connections and sees every other one
// running, and every quorum queue has all its members online.
func (c *RabbitCluster) Restore(t testing.TB) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(c.nodes))
	for i, n := range c.nodes {
		if n.Running() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.start()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("testenv: restart RabbitMQ nodes: %v", err)
	}
	deadline := time.Now().Add(clusterSettleTimeout)
	for {
		why := c.notWhole()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: RabbitMQ cluster not whole within %v: %s", clusterSettleTimeout, why)
		}
		time.Sleep(ctlPollInterval) // polling a condition
	}
}

// notWhole says what keeps the cluster from being whole, "" when it is.
// Each rabbitmqctl call costs a second or more (an Erlang VM starts), so it
// asks as little as it can: the quorum queues' members online, which every
// node running implies when there is a quorum queue (they have a member on
// each), else the running nodes as the first node sees them.
func (c *RabbitCluster) notWhole() string {
	queues, err := c.quorumQueues()
	if err != nil {
		return err.Error()
	}
	for _, q := range queues {
		if len(q.Online) != len(c.nodes) || q.Leader == "" {
			return fmt.Sprintf("quorum queue %s: leader %q, members online %v", q.Name, q.Leader, q.Online)
		}
	}
	if len(queues) > 0 {
		return ""
	}
	n := c.nodes[0]
	out, err := n.runCtl(n.ctl, "eval", "length(rabbit_nodes:all_running()).")
	if err != nil {
		return err.Error()
	}
	if strings.TrimSpace(out) != fmt.Sprint(len(c.nodes)) {
		return fmt.Sprintf("node %s sees %s nodes running", n.name, strings.TrimSpace(out))
	}
	return ""
}

// quorumQueue is a line of rabbitmqctl list_queues for a quorum queue.
type quorumQueue struct {
	Name    string   `json:"name"`
	Type    string   `json:"type"`
	Leader  string   `json:"leader"`
	Members []string `json:"members"`
	Online  []string `json:"online"`
}

// quorumQueues lists the quorum queues, asking the first running node.
func (c *RabbitCluster) quorumQueues() ([]quorumQueue, error) {
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		out, err := n.runCtl(n.ctl, "list_queues", "-q", "--formatter", "json", "name", "type", "leader", "members", "online")
		if err != nil {
			return nil, err
		}
		var all []json.RawMessage
		if err := json.Unmarshal([]byte(out), &all); err != nil {
			return nil, fmt.Errorf("parse rabbitmqctl list_queues: %w\n%s", err, out)
		}
		var qs []quorumQueue
		for _, raw := range all {
			var q quorumQueue
			if json.Unmarshal(raw, &q) == nil && q.Type == "quorum" {
				qs = append(qs, q)
			}
		}
		return qs, nil
	}
	return nil, errors.New("no node of the cluster is running")
}

// QuorumLeader returns the index of the node that leads quorum queue queue,
// waiting (up to a minute) while it has none.
func (c *RabbitCluster) QuorumLeader(t testing.TB, queue string) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		qs, err := c.quorumQueues()
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		for _, q := range qs {
			if q.Name != queue {
				continue
			}
			for i, n := range c.nodes {
				if q.Leader == n.name {
					return i
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: quorum queue %s has no leader among %v: %+v", queue, c.nodes, qs)
		}
		time.Sleep(ctlPollInterval) // polling a condition
	}
}

// ClusterBroker is a test's exchange on a RabbitCluster with a quorum queue
// and a classic queue bound to it with "#".
type ClusterBroker struct {
	URLs     string // every node's URL, comma-separated (see RabbitCluster.URLs)
	Exchange string // durable topic exchange
	Quorum   string // quorum queue bound with "#", a member on every node
	Classic  string // durable classic queue bound with "#", on node ClassicNode
	// ClassicNode is the node the classic queue lives on (it was declared
	// there: RabbitMQ places a classic queue on the declaring node).
	ClassicNode int
}

// Broker declares the test's durable topic exchange and a quorum queue over
// node 0 (which then leads the queue, as a rule), and a classic queue on
// node classicNode, both bound with "#", and deletes them at cleanup (after
// Restore when a node is down, so that a test that failed mid-fault leaves
// nothing behind).
func (c *RabbitCluster) Broker(t testing.TB, classicNode int) *ClusterBroker {
	t.Helper()
	name := objectName(t.Name(), "test.", ".", 180)
	b := &ClusterBroker{URLs: c.URLs(), Exchange: name, Quorum: name + ".quorum", Classic: name + ".classic", ClassicNode: classicNode}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if !n.Running() {
				c.Restore(t) // the test failed with a node down
				break
			}
		}
		if err := c.deleteBroker(b); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	declare := func(node int, f func(ch *amqp.Channel) error) {
		conn, err := dialAMQP(c.nodes[node].URL())
		if err != nil {
			t.Fatalf("testenv: connect to RabbitMQ node %s: %v", c.nodes[node].name, err)
		}
		defer conn.Close()
		if err := withChannel(conn, f); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	declare(0, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(b.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", b.Exchange, err)
		}
		if _, err := ch.QueueDeclare(b.Quorum, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			return fmt.Errorf("declare quorum queue %s: %w", b.Quorum, err)
		}
		if err := ch.QueueBind(b.Quorum, "#", b.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind %s: %w", b.Quorum, err)
		}
		return nil
	})
	declare(classicNode, func(ch *amqp.Channel) error { return declareBoundQueue(ch, b.Classic, b.Exchange, "#") })
	c.Restore(t) // every member of the new quorum queue online
	return b
}

func (c *RabbitCluster) deleteBroker(b *ClusterBroker) error {
	conn, err := dialAMQP(c.nodes[0].URL())
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ node %s for cleanup: %w", c.nodes[0].name, err)
	}
	defer conn.Close()
	for _, q := range []string{b.Quorum, b.Classic} {
		if err := withChannel(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(q, false, false, false)
			return err
		}); err != nil {
			return fmt.Errorf("delete queue %s: %w", q, err)
		}
	}
	if err := withChannel(conn, func(ch *amqp.Channel) error { return ch.ExchangeDelete(b.Exchange, false, false) }); err != nil {
		return fmt.Errorf("delete exchange %s: %w", b.Exchange, err)
	}
	return nil
}
