package bench

import (
	"bytes"
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// A shape named with fullSuffix ("keys1000+full") is its base shape beside
// one queue kept full: the rows of one more key, fullKey, name an exchange
// of their own bound to a queue of fullQueueLength messages that refuses
// what does not fit (x-overflow=reject-publish) and has no consumer. The
// queue is full before the relay starts, a row of fullKey follows every
// fullEvery rows of the backlog, and fullKey's producer writes on, a row
// every fullPace, while the catch-up runs: the broker nacks fullKey's
// messages all along. The shape's figures are its other keys' messages
// into the bench queue, to set beside the base shape's.
const (
	fullSuffix      = "+full"
	fullKey         = "full"
	fullQueueLength = 50
	fullEvery       = 64
	fullPace        = 20 * time.Millisecond
)

// fullQueue is the queue a "+full" shape keeps full, and its exchange.
type fullQueue struct {
	exchange, queue string
	conn            *amqp.Connection // bench's own (the consumer's); a channel per use
}

// fill declares the exchange and the queue (again, after drop), empties the
// queue and publishes fullQueueLength messages into it, each confirmed.
func (q *fullQueue) fill() error {
	return q.withChannel(func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(q.exchange, amqp.ExchangeFanout, false, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", q.exchange, err)
		}
		args := amqp.Table{"x-max-length": int64(fullQueueLength), "x-overflow": "reject-publish"}
		if _, err := ch.QueueDeclare(q.queue, false, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %s: %w", q.queue, err)
		}
		if err := ch.QueueBind(q.queue, "", q.exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s: %w", q.queue, err)
		}
		if _, err := ch.QueuePurge(q.queue, false); err != nil {
			return fmt.Errorf("purge queue %s: %w", q.queue, err)
		}
		if err := ch.Confirm(false); err != nil {
			return fmt.Errorf("confirm mode: %w", err)
		}
		for i := range fullQueueLength {
			dc, err := ch.PublishWithDeferredConfirm(q.exchange, fullKey, true, false, amqp.Publishing{Body: []byte("fill")})
			if err != nil {
				return fmt.Errorf("fill queue %s: publish %d: %w", q.queue, i, err)
			}
			if !dc.Wait() {
				return fmt.Errorf("fill queue %s: message %d nacked", q.queue, i)
			}
		}
		return nil
	})
}

// depth is the number of messages in the queue.
func (q *fullQueue) depth() (n int, err error) {
	err = q.withChannel(func(ch *amqp.Channel) error {
		st, err := ch.QueueDeclarePassive(q.queue, false, false, false, false, nil)
		n = st.Messages
		return err
	})
	return n, err
}

// drop deletes the queue: the relay's messages of fullKey come back
// unroutable and go to outbox_failed, so that nothing held keeps the relay
// from stopping at once.
func (q *fullQueue) drop() error {
	return q.withChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(q.queue, false, false, false)
		return err
	})
}

// close deletes the queue and the exchange, so the bench leaves nothing
// behind in the broker.
func (q *fullQueue) close() {
	_ = q.withChannel(func(ch *amqp.Channel) error {
		_, _ = ch.QueueDelete(q.queue, false, false, false)
		return ch.ExchangeDelete(q.exchange, false, false)
	})
}

func (q *fullQueue) withChannel(f func(*amqp.Channel) error) error {
	ch, err := q.conn.Channel()
	if err != nil {
		return fmt.Errorf("bench: full queue: open channel: %w", err)
	}
	defer ch.Close()
	if err := f(ch); err != nil {
		return fmt.Errorf("bench: full queue: %w", err)
	}
	return nil
}

// fullRow is a row of fullKey.
func (b *bencher) fullRow() outbox.Message {
	return outbox.Message{PartitionKey: fullKey, Exchange: b.full.exchange, RoutingKey: fullKey,
		Payload: bytes.Repeat([]byte("x"), b.cfg.PayloadBytes)}
}

// writeFull writes a row of fullKey every fullPace, fullKey's producer
// writing on, until stop is called; stop returns the first error.
func (b *bencher) writeFull(ctx context.Context) (stop func() error) {
	quit, done := make(chan struct{}), make(chan error, 1)
	go func() {
		tick := time.NewTicker(fullPace) // the producer's pace is what is simulated
		defer tick.Stop()
		for {
			select {
			case <-quit:
				done <- nil
				return
			case <-ctx.Done():
				done <- ctx.Err()
				return
			case <-tick.C:
			}
			if err := b.writeTxn(ctx, []outbox.Message{b.fullRow()}); err != nil {
				done <- fmt.Errorf("the full key's producer: %w", err)
				return
			}
		}
	}()
	return func() error {
		close(quit)
		return <-done
	}
}

// checkFull fails unless the full queue still holds fullQueueLength
// messages: it stayed full while the catch-up ran.
func (b *bencher) checkFull() error {
	n, err := b.full.depth()
	if err != nil {
		return err
	}
	if n != fullQueueLength {
		return fmt.Errorf("the full queue holds %d messages at the end of the catch-up, not %d: it did not stay full", n, fullQueueLength)
	}
	return nil
}
