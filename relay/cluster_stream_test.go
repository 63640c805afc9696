package relay

import (
	"fmt"
	"strings"
	"testing"
	"time"

	sstream "github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/streams"
)

// streamLeaderKilled is TestRelayOnCluster's stream fault: the relay
// publishes into partition streams replicated on the three nodes, given
// every node's stream URL, and the node leading partition 0 is killed
// (SIGKILL) mid-stream. The next term asks another node where the streams' new
// leaders are, connects to them, and publishes again from its checkpoint
// with the same publishing ids, which the new leaders drop where the old
// one had stored the message: every message once in the streams, in
// commit order per key.
func streamLeaderKilled(t *testing.T, c *testenv.RabbitCluster) {
	const parts = 2
	ctx := testenv.WorkContext(t)
	db := testenv.MySQL(t)
	db.Migrate(testenv.Context(t, time.Minute), t)
	urls := make([]string, testenv.ClusterSize)
	amqpURLs := make([]string, testenv.ClusterSize)
	for i, n := range c.Nodes() {
		urls[i], amqpURLs[i] = n.StreamURL(), n.URL()
	}
	sc := streams.Config{Stream: fmt.Sprintf("cluster-%d", time.Now().UnixNano()), Partitions: parts, URL: strings.Join(urls, ",")}
	names := declarePartitions(t, sc)
	leader := streamLeader(t, c, names[0])
	// Read and deleted through a node that stays up: a node killed and
	// started again answered "stream not available" for minutes on 3.10.8
	// (its stream coordinator member not yet back).
	survivor := c.Node((leader + 1) % testenv.ClusterSize).StreamURL()
	testenv.DeleteStreamsAtCleanup(t, survivor, names...)

	reg, m, err := metrics.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	v := validator.New()
	startRelay(t, db, &testenv.Broker{URL: strings.Join(amqpURLs, ","), Exchange: "amq.direct"}, func(cfg *Config) {
		cfg.Metrics, cfg.Stream = m, sc
	})
	load := make(chan error, 1)
	go func() { // owned by the test: it waits on load below
		load <- testload.Run(ctx, db.SQL, v, testload.Load{
			Producers: 8, Partitions: clusterKeys, Total: clusterTotal, BigTxn: 100, BigShare: 0.2, Exchange: "amq.direct",
		})
	}()
	published := func() float64 { return counterValue(t, reg, "outbox_relay_published_total") }
	if err := pollWhile(ctx, published, func() bool { return published() >= 1_000 }); err != nil {
		t.Fatalf("only %v messages confirmed: %v", published(), err)
	}
	if p := published(); p >= clusterTotal {
		t.Fatalf("all %v messages were confirmed before the fault: it would prove nothing", p)
	}
	c.Node(leader).Kill(t)
	atKill := published()
	t.Logf("killed node %d, leading partition stream 0, after %v messages were confirmed", leader, atKill)
	// The relay publishes again, through the new leaders, before the node
	// is back.
	if err := pollUntil(ctx, func() bool { return published() > atKill+500 || published() >= clusterTotal }); err != nil {
		t.Fatalf("no message confirmed since node %d was killed (%v confirmed): %v", leader, published(), err)
	}
	t.Logf("publishing through node %d's successor: %v messages confirmed", leader, published())
	c.Node(leader).Start(t)
	if err := <-load; err != nil {
		t.Fatal(err)
	}
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	c.Restore(t)
	if err := validator.ReadStreams(ctx, survivor, names, v); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages through the kill of the streams' leader: %d in the streams, %d duplicates", v.ExpectedCount(), v.Received(), v.Duplicates())
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
}

// streamLeader is the node leading stream name, as the broker reports it.
func streamLeader(t *testing.T, c *testenv.RabbitCluster, name string) int {
	t.Helper()
	env, err := sstream.NewEnvironment(sstream.NewEnvironmentOptions().SetUri(c.Node(0).StreamURL()))
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	var md *sstream.StreamMetadata
	if err := progress.Wait(testenv.WorkContext(t), "the stream's leader", func() int64 { return 0 }, func() bool {
		md, err = env.StreamMetaData(name)
		return err == nil && md.Leader != nil
	}); err != nil {
		t.Fatalf("no leader of %s: %v (%v)", name, err, md)
	}
	for i, n := range c.Nodes() {
		if n.StreamAddr() == md.Leader.Host+":"+md.Leader.Port {
			return i
		}
	}
	t.Fatalf("%s is led by %s:%s, not a node of the cluster", name, md.Leader.Host, md.Leader.Port)
	return -1
}
