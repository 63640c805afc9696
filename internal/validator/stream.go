package validator

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	samqp "github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/dedup"
)

// ConsumeStreams feeds every message stored in the given streams after it
// returns (offset "next") to v as the AMQP delivery it stands for (docs/wire.md, the stream
// destination): message-id, subject as type, content-type, creation-time as
// timestamp, the application properties as headers (x-exchange and
// x-routing-key as the delivery's exchange and routing key), the body. It
// returns once every consumer is registered; stop closes them. Each
// consumer asks for 200 chunks ahead: the relay's small batches make small
// chunks, and the client's default credit reads them a round trip each.
func ConsumeStreams(url string, streams []string, v *Validator) (stop func(), err error) {
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(url))
	if err != nil {
		return nil, fmt.Errorf("validator: connect to the stream protocol: %w", err)
	}
	for _, name := range streams {
		_, err := env.NewConsumer(name, func(_ stream.ConsumerContext, m *samqp.Message) {
			v.Observe(StreamDelivery(m))
		}, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.Next()).SetInitialCredits(200))
		if err != nil {
			env.Close()
			return nil, fmt.Errorf("validator: consume stream %s: %w", name, err)
		}
	}
	return func() { _ = env.Close() }, nil
}

// StreamDelivery is the AMQP delivery a stream message stands for
// (dedup.StreamDelivery), its timestamp in whole seconds as AMQP 0-9-1
// carries it, so that both destinations compare alike.
func StreamDelivery(m *samqp.Message) amqp.Delivery {
	d := dedup.StreamDelivery(m)
	d.Timestamp = d.Timestamp.Truncate(time.Second)
	return d
}
