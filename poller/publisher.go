package poller

import (
	"context"

	"github.com/outbox-relay/outbox-relay/publish"
)

// Publisher opens the channels the poller's workers publish on: AMQP (an
// adapter over *publish.Publisher) or the stream destination's routers.
type Publisher interface {
	// NewChannel opens a channel whose every result goes to onResult.
	NewChannel(onResult func(publish.Result)) (Channel, error)
}

// Channel is one worker's channel, with *publish.Channel's contract:
// Publish sends asynchronously (each accepted message gets one Result),
// Flush waits for every result, Close ends it.
type Channel interface {
	Publish(ctx context.Context, m publish.Message) error
	Flush(ctx context.Context) error
	Close() error
}

// AMQP is pub as the poller's Publisher.
func AMQP(pub *publish.Publisher) Publisher { return amqpPublisher{pub} }

type amqpPublisher struct{ pub *publish.Publisher }

func (a amqpPublisher) NewChannel(onResult func(publish.Result)) (Channel, error) {
	ch, err := a.pub.NewChannel(onResult)
	if err != nil {
		return nil, err
	}
	return ch, nil
}
