package streams_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// publishNamed publishes one message per name through pr, numbered by pr
// (Seq 0), and waits for every result.
func publishNamed(t *testing.T, pr *streams.Producer, names ...string) {
	t.Helper()
	msgs := make([]publish.Message, len(names))
	for i, n := range names {
		msgs[i].Publishing.MessageId = n
	}
	publishConfirmed(t, pr, msgs)
}

// Finding 1 against the real broker: a new leader (epoch 2) numbers freshly
// while a frozen leader of epoch 1 still has messages to send under the
// same producer name. The new leader asked the broker before the old
// leader's messages were stored, so the broker's last id told it nothing;
// numbering from the epoch's base keeps its ids above the old leader's, and
// the stream holds every message of both (numbered from the broker's last
// id, the new leader's messages took the old one's ids and were dropped as
// duplicates).
func TestFreshIDsOfANewEpochNeverCollideWithAnOlderLeader(t *testing.T) {
	t.Parallel()
	b := testenv.RabbitMQ(t)
	u, err := streams.FromAMQP(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := streams.Config{Stream: fmt.Sprintf("test-fresh-%d", time.Now().UnixNano()), Partitions: 1, URL: u,
		Producer: "z", Window: 4}
	ctx := testenv.WorkContext(t)
	old, err := streams.DialTerm(cfg, streams.NewIssued(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := old.Declare(); err != nil {
		t.Fatal(err)
	}
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(u))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	testenv.DeleteStreamsAtCleanup(t, u, cfg.PartitionName(0))
	// The old leader opened its producer (numbering from epoch 1) and froze
	// before sending.
	oldPr, err := old.StartFresh(ctx, "z-0", 0)
	if err != nil {
		t.Fatal(err)
	}
	// The new leader starts: the broker has stored nothing of the name.
	neu, err := streams.DialTerm(cfg, streams.NewIssued(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer neu.Close()
	newPr, err := neu.StartFresh(ctx, "z-0", 0)
	if err != nil {
		t.Fatal(err)
	}
	// The old leader thaws and sends its queued messages, then the new
	// leader publishes.
	publishNamed(t, oldPr, "old-1", "old-2", "old-3")
	publishNamed(t, newPr, "new-1", "new-2", "new-3")

	got := make(chan string, 16)
	c, err := env.NewConsumer(cfg.PartitionName(0), func(_ stream.ConsumerContext, m *amqp.Message) {
		got <- fmt.Sprint(m.Properties.MessageID)
	}, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ids []string
	for len(ids) < 6 {
		select {
		case id := <-got:
			ids = append(ids, id)
		case <-time.After(10 * time.Second):
			t.Fatalf("the stream holds %v, want the old leader's 3 and the new leader's 3", ids)
		case <-ctx.Done():
			t.Fatalf("read %v", ids)
		}
	}
	if want := "[old-1 old-2 old-3 new-1 new-2 new-3]"; fmt.Sprint(ids) != want {
		t.Errorf("stream holds %v, want %s", ids, want)
	}
	if newPr.Last() <= oldPr.Last() {
		t.Errorf("new leader's ids end at %d, not above the old leader's %d", newPr.Last(), oldPr.Last())
	}
}
