package streams_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// publishAll publishes one message per id (in Seq, 0 for the producer's
// next) through pr and waits for every result.
func publishAll(t *testing.T, pr *streams.Producer, ids ...uint64) {
	t.Helper()
	msgs := make([]publish.Message, len(ids))
	for i, id := range ids {
		msgs[i].Seq = id
		msgs[i].Publishing.MessageId = fmt.Sprint("m", id)
	}
	publishConfirmed(t, pr, msgs)
}

// publishConfirmed publishes msgs through pr and fails unless each is
// confirmed.
func publishConfirmed(t *testing.T, pr *streams.Producer, msgs []publish.Message) {
	t.Helper()
	results := make(chan publish.Result, len(msgs))
	for _, m := range msgs {
		if err := pr.Publish(context.Background(), m, func(r publish.Result) { results <- r }); err != nil {
			t.Fatal(err)
		}
	}
	for range msgs {
		if r := <-results; r.Outcome != publish.Confirmed {
			t.Fatalf("result %+v", r)
		}
	}
}

func seq(from, to uint64) []uint64 {
	var out []uint64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// What the exactly-once design rests on, against the real broker: a named
// producer's ids 1-10, then a new connection's producer of the same name
// sending 5-15 (a restart re-publishing its tail): every message is
// confirmed, the stream holds 15, and the broker's last id is 15. A
// producer numbering by itself (StartAbove the broker's last) never
// reuses a stored id. Ids that do not increase are refused before sending.
func TestBrokerDropsRepeatedIDs(t *testing.T) {
	t.Parallel()
	b := testenv.RabbitMQ(t)
	u, err := streams.FromAMQP(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := streams.Config{Stream: fmt.Sprintf("test-dedup-%d", time.Now().UnixNano()), Partitions: 1, URL: u,
		Producer: "p", Window: 4}
	pub, err := streams.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Declare(); err != nil {
		t.Fatal(err)
	}
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(u))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	testenv.DeleteStreamsAtCleanup(t, u, cfg.PartitionName(0))
	pr, err := pub.Producer(context.Background(), "p", 0)
	if err != nil {
		t.Fatal(err)
	}
	publishAll(t, pr, seq(1, 10)...)
	if err := pr.Publish(context.Background(), publish.Message{Seq: 10}, nil); err == nil {
		t.Error("an id not above the last sent was accepted")
	}
	pub.Close()

	pub, err = streams.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if last, err := pub.LastIDs(context.Background(), "p"); err != nil || last[0] != 10 {
		t.Fatalf("broker's last id %v, %v; want 10", last, err)
	}
	pr, err = pub.Producer(context.Background(), "p", 0)
	if err != nil {
		t.Fatal(err)
	}
	publishAll(t, pr, seq(5, 15)...)
	// Numbering by itself, above the broker's last: 16, 17.
	pr2, err := pub.Producer(context.Background(), "q", 0)
	if err != nil {
		t.Fatal(err)
	}
	pr2.StartAbove(3)
	publishAll(t, pr2, 0, 0)
	if pr2.Last() != 5 {
		t.Errorf("producer q numbered up to %d, want 5", pr2.Last())
	}
	if last, err := pub.LastIDs(context.Background(), "p"); err != nil || last[0] != 15 {
		t.Fatalf("broker's last id %v, %v; want 15", last, err)
	}

	// Read the stream: m1 … m15 once each, then q's two.
	got := make(chan string, 64)
	c, err := env.NewConsumer(cfg.PartitionName(0), func(_ stream.ConsumerContext, m *amqp.Message) {
		got <- fmt.Sprint(m.Properties.MessageID)
	}, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testenv.WorkContext(t)
	var ids []string
	for len(ids) < 17 {
		select {
		case id := <-got:
			ids = append(ids, id)
		case <-ctx.Done():
			t.Fatalf("read %v", ids)
		}
	}
	want := append([]string{}, "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9", "m10", "m11", "m12", "m13", "m14", "m15", "m0", "m0")
	if fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Errorf("stream holds %v, want %v", ids, want)
	}
}
