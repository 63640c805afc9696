package validator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	samqp "github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/dedup"
	"github.com/outbox-relay/outbox-relay/internal/progress"
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

// ReadStreams reads the given streams from their first offsets to their
// ends, feeding every message to v as ConsumeStreams does, and returns once
// it has read them all. So v sees each message as often as the streams store
// it, whatever happened to the broker or to a live consumer meanwhile (a
// node restart ends the stream consumers of ConsumeStreams, which do not
// reconnect): the sound count after the fact. Call it when nothing publishes
// into the streams any more.
//
// The end of a stream is a marker: ReadStreams first appends one message
// with a message-id of its own to every stream (from a producer without a
// name, so the broker deduplicates nothing), waits for the broker's
// confirms, then reads each stream up to its marker, which v does not see.
// The reading is bounded by progress: it fails when no message has arrived
// for progress.Patience, or when ctx ends.
func ReadStreams(ctx context.Context, url string, streams []string, v *Validator) error {
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(url))
	if err != nil {
		return fmt.Errorf("validator: connect to the stream protocol: %w", err)
	}
	defer env.Close()
	marker := fmt.Sprintf("validator-end-of-stream-%016x", rand.Uint64())
	for _, name := range streams {
		if err := appendMarker(ctx, env, name, marker); err != nil {
			return err
		}
	}
	var (
		read atomic.Int64 // messages read, markers included: the progress
		mu   sync.Mutex
		ends = map[string]bool{}
	)
	for _, name := range streams {
		var c *stream.Consumer
		err := whileUnavailable(ctx, func() (err error) {
			c, err = env.NewConsumer(name, func(cc stream.ConsumerContext, m *samqp.Message) {
				if m.Properties != nil && m.Properties.MessageID == marker {
					mu.Lock()
					ends[cc.Consumer.GetStreamName()] = true
					mu.Unlock()
				} else {
					v.Observe(StreamDelivery(m))
				}
				read.Add(1)
			}, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()).SetInitialCredits(200))
			return err
		})
		if err != nil {
			return fmt.Errorf("validator: consume stream %s: %w", name, err)
		}
		defer c.Close()
	}
	err = progress.Wait(ctx, "read the streams to their ends", read.Load, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ends) == len(streams)
	})
	if err != nil {
		return fmt.Errorf("validator: %w (%d messages read)", err, read.Load())
	}
	return nil
}

// appendMarker publishes the end marker into one stream and waits for its
// confirm.
func appendMarker(ctx context.Context, env *stream.Environment, name, marker string) error {
	var p *stream.Producer
	err := whileUnavailable(ctx, func() (err error) {
		p, err = env.NewProducer(name, stream.NewProducerOptions())
		return err
	})
	if err != nil {
		return fmt.Errorf("validator: producer on stream %s: %w", name, err)
	}
	defer p.Close()
	confirms := p.NotifyPublishConfirmation()
	m := samqp.NewMessage([]byte(marker))
	m.Properties = &samqp.MessageProperties{MessageID: marker}
	if err := p.Send(m); err != nil {
		return fmt.Errorf("validator: append the end marker to stream %s: %w", name, err)
	}
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	select {
	case cs := <-confirms:
		for _, c := range cs {
			if !c.IsConfirmed() {
				return fmt.Errorf("validator: end marker of stream %s not confirmed: %v", name, c.GetError())
			}
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("validator: end marker of stream %s: no confirm: %w", name, ctx.Err())
	}
}

// StreamDelivery is the AMQP delivery a stream message stands for
// (dedup.StreamDelivery), its timestamp in whole seconds as AMQP 0-9-1
// carries it, so that both destinations compare alike.
func StreamDelivery(m *samqp.Message) amqp.Delivery {
	d := dedup.StreamDelivery(m)
	d.Timestamp = d.Timestamp.Truncate(time.Second)
	return d
}

// whileUnavailable calls open until it returns anything but the broker's
// "stream not available" (a member of the stream on a node that has just
// restarted, not yet in sync), for one progress.Step at most.
func whileUnavailable(ctx context.Context, open func() error) error {
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	for {
		err := open()
		if !errors.Is(err, stream.StreamNotAvailable) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}
