package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/publish"
)

// consumer receives from the bench queue and counts distinct message ids
// against the number a phase expects, and the deliveries that repeated one,
// with commit → receive latencies for the messages whose commit time was
// recorded.
type consumer struct {
	exchange, queue string
	qtype           string // "classic" or "quorum"
	conn            *amqp.Connection
	ch              *amqp.Channel
	probe           *amqp.Channel // queue depth, on its own channel
	tag             string        // consumer tag while consuming, "" while paused
	done            chan struct{} // closed when the delivery loop of the current consume ends

	mu        sync.Mutex
	want      int
	delivered int // in this phase, repeats included
	got       map[string]bool
	commits   map[string]time.Time
	lats      []time.Duration
	changed   chan struct{}
}

func newConsumer(ctx context.Context, url string, opts publish.ConnOptions, exchange, queue, queueType string) (*consumer, error) {
	conn, err := publish.Dial(ctx, url, opts, "outbox-relay bench consumer")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	c := &consumer{exchange: exchange, queue: queue, qtype: queueType, conn: conn, changed: make(chan struct{}, 1)}
	if err := c.setup(); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

func (c *consumer) setup() error {
	ch, err := c.conn.Channel()
	if err != nil {
		return fmt.Errorf("bench: open channel: %w", err)
	}
	c.ch = ch
	if err := ch.ExchangeDeclare(c.exchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("bench: declare exchange %s: %w", c.exchange, err)
	}
	var args amqp.Table
	if c.qtype == "quorum" {
		args = amqp.Table{"x-queue-type": "quorum"}
	}
	if _, err := ch.QueueDeclare(c.queue, true, false, false, false, args); err != nil {
		return fmt.Errorf("bench: declare queue %s: %w", c.queue, err)
	}
	if err := ch.QueueBind(c.queue, "#", c.exchange, false, nil); err != nil {
		return fmt.Errorf("bench: bind queue %s: %w", c.queue, err)
	}
	if _, err := ch.QueuePurge(c.queue, false); err != nil {
		return fmt.Errorf("bench: purge queue %s: %w", c.queue, err)
	}
	if c.probe, err = c.conn.Channel(); err != nil {
		return fmt.Errorf("bench: open channel: %w", err)
	}
	return c.resume()
}

// resume starts consuming (auto-ack) and counting what arrives.
func (c *consumer) resume() error {
	c.tag = fmt.Sprintf("bench-%d", time.Now().UnixNano())
	deliveries, err := c.ch.Consume(c.queue, c.tag, true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("bench: consume %s: %w", c.queue, err)
	}
	done := make(chan struct{})
	c.done = done
	go func() {
		defer close(done)
		for d := range deliveries {
			c.received(d.MessageId, time.Now())
		}
	}()
	return nil
}

// pause stops consuming: messages stay in the queue until resume. The
// throughput phases run paused, so that they measure publishing into the
// queue and no consumer shares the machine with the publisher measured.
func (c *consumer) pause() error {
	if err := c.ch.Cancel(c.tag, false); err != nil {
		return fmt.Errorf("bench: cancel consumer: %w", err)
	}
	<-c.done // amqp091 closes deliveries once the broker confirmed the cancel
	c.tag = ""
	return nil
}

// depth is the number of messages ready in the queue.
func (c *consumer) depth() (int, error) {
	q, err := c.probe.QueueDeclarePassive(c.queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("bench: read depth of queue %s: %w", c.queue, err)
	}
	return q.Messages, nil
}

// waitDepth blocks until the queue holds at least n messages: everything a
// throughput phase publishes has been routed to and accepted by the queue.
func (c *consumer) waitDepth(ctx context.Context, n int, timeout time.Duration, progress func(int)) error {
	deadline := time.Now().Add(timeout)
	for {
		got, err := c.depth()
		if err != nil {
			return err
		}
		if progress != nil {
			progress(got)
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the queue holds %d of %d messages after %s", got, n, timeout)
		}
		// A passive declare is one round trip: polling every 20 ms costs
		// the broker next to nothing and the phase at most 20 ms.
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// close deletes the bench's queue and exchange, so a bench leaves nothing
// behind in the broker (deleting the queue also ends a consume), and closes
// the connection.
func (c *consumer) close() {
	if ch, err := c.conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(c.queue, false, false, false)
		_ = ch.ExchangeDelete(c.exchange, false, false)
		_ = ch.Close()
	}
	c.conn.Close()
	if c.done != nil {
		<-c.done
	}
}

func (c *consumer) purge() error {
	if _, err := c.ch.QueuePurge(c.queue, false); err != nil {
		return fmt.Errorf("bench: purge queue: %w", err)
	}
	return nil
}

// expect starts a phase that waits for n distinct messages.
func (c *consumer) expect(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.want, c.delivered, c.got, c.commits, c.lats = n, 0, map[string]bool{}, map[string]time.Time{}, nil
}

// sent records when a message's commit started.
func (c *consumer) sent(id string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commits[id] = at
}

func (c *consumer) received(id string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.got == nil {
		return
	}
	c.delivered++
	if c.got[id] {
		return
	}
	c.got[id] = true
	if t, ok := c.commits[id]; ok {
		c.lats = append(c.lats, at.Sub(t))
	}
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (c *consumer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

// wait blocks until the phase's messages have all arrived.
func (c *consumer) wait(ctx context.Context, timeout time.Duration, progress func(int)) error {
	deadline := time.After(timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		n := c.count()
		c.mu.Lock()
		want := c.want
		c.mu.Unlock()
		if progress != nil {
			progress(n)
		}
		if n >= want {
			return nil
		}
		select {
		case <-c.changed:
		case <-tick.C:
		case <-deadline:
			return fmt.Errorf("%d of %d messages arrived within %s", n, want, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// repeats is, once every message of the phase arrived, how many deliveries
// repeated one: those received so far and those still in the queue. It
// stops consuming to count what is left, and resumes.
func (c *consumer) repeats() (int, error) {
	if err := c.pause(); err != nil {
		return 0, err
	}
	left, err := c.depth()
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	n := c.delivered - len(c.got) + left
	c.mu.Unlock()
	return n, c.resume()
}

// repeatedSoFar is how many deliveries of the phase repeated a message so
// far (a stream's consumer has no queue depth to add).
func (c *consumer) repeatedSoFar() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.delivered - len(c.got)
}

func (c *consumer) latencies() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.lats...)
}
