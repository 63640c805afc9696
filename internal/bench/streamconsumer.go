package bench

import (
	"fmt"
	"sync"
	"time"

	samqp "github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/streams"
)

// streamConsumer reads partition streams from their first offset, on a
// connection of its own, and hands each message's id (the message-id
// property) to the bench consumer's count (consumer.received): the phases'
// waits, latencies and repeat counts then work on the streams as they do on
// the queue. Its owner ends it with close; nothing is counted after that.
type streamConsumer struct {
	env *stream.Environment

	mu     sync.Mutex
	closed bool
}

// consumeStreams attaches a consumer to each of the partition streams of
// cfg from its first offset, counting into into; it returns once every one
// is registered. Each asks for 200 chunks ahead (the relay's small batches
// make small chunks, which the client's default credit reads a round trip
// each).
func consumeStreams(cfg streams.Config, into *consumer) (*streamConsumer, error) {
	env, err := streams.Environment(cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: stream consumer: %w", err)
	}
	s := &streamConsumer{env: env}
	for i := range cfg.Partitions {
		name := cfg.PartitionName(i)
		_, err := env.NewConsumer(name, func(_ stream.ConsumerContext, m *samqp.Message) {
			at := time.Now()
			var id string
			if m.Properties != nil {
				id, _ = m.Properties.MessageID.(string)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if !s.closed {
				into.received(id, at)
			}
		}, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()).SetInitialCredits(200).
			SetClientProvidedName("outbox-relay bench consumer"))
		if err != nil {
			_ = env.Close()
			return nil, fmt.Errorf("bench: consume stream %s: %w", name, err)
		}
	}
	return s, nil
}

// close stops counting, then closes the consumers and their connection.
func (s *streamConsumer) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	_ = s.env.Close()
}
