package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/dedup"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// consumer is the demo's consuming service: a dedup.Consumer named "demo"
// whose handler applies each order update once, plus the bookkeeping the
// demo prints.
type consumer struct {
	consumer    *dedup.Consumer
	cancel      context.CancelFunc
	done        chan error // Run's result
	replayEvery int
	replays     chan amqp.Delivery // copies to publish
	replayDone  chan struct{}      // closed when the replayer has stopped
	pub         *amqp.Channel      // publishes the copies

	mu        sync.Mutex
	committed map[string]time.Time // message id → when its producer began to commit
	pending   map[string]bool      // sent in this run, not handled yet
	handled   int                  // handler runs
	replayed  int                  // copies published
	latencies []time.Duration
}

// startConsumer starts consuming queue through the inbox, until stop.
func startConsumer(ctx context.Context, db *sql.DB, conn *amqp.Connection, queue string, replayEvery int) (*consumer, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open consumer channel: %w", err)
	}
	pub, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open replay channel: %w", err)
	}
	c := &consumer{
		done:        make(chan error, 1),
		replayEvery: replayEvery,
		replays:     make(chan amqp.Delivery, 16),
		replayDone:  make(chan struct{}),
		pub:         pub,
		committed:   map[string]time.Time{},
		pending:     map[string]bool{},
	}
	c.consumer = &dedup.Consumer{
		Inbox: dedup.New(db, "demo"),
		Queue: queue,
		// One worker: updates of an order are applied in the order the
		// relay delivered them.
		Handlers: map[string]dedup.DeliveryHandler{"order.updated": c.handle},
	}
	runCtx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	go func() { c.done <- c.consumer.Run(runCtx, ch) }()
	go c.replayer(runCtx)
	return c, nil
}

// handle applies one order update: one row in demo_order_updates, in the
// inbox's transaction.
func (c *consumer) handle(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error {
	var body struct{ Order, Step int }
	if err := json.Unmarshal(d.Body, &body); err != nil {
		return fmt.Errorf("decode order update: %w", err)
	}
	id, err := outbox.ParseMessageID(d.MessageId)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO demo_order_updates (message_id, order_no, step) VALUES (?, ?, ?)",
		id[:], body.Order, body.Step); err != nil {
		return fmt.Errorf("record order update: %w", err)
	}

	now := time.Now()
	c.mu.Lock()
	// Without a recorded commit (a message from an earlier run), fall back
	// to created_at: the AMQP timestamp, whole seconds.
	lat := now.Sub(d.Timestamp)
	if sent, ok := c.committed[d.MessageId]; ok {
		lat = now.Sub(sent)
		c.latencies = append(c.latencies, lat)
	}
	delete(c.pending, d.MessageId)
	c.handled++
	replay := c.replayEvery > 0 && c.handled%c.replayEvery == 0
	c.mu.Unlock()
	fmt.Printf("processed %-14s key=%-10s id=%s latency=%6.2fms body=%s\n",
		d.Type, d.Headers["x-partition-key"], d.MessageId, float64(lat.Microseconds())/1000, d.Body)
	if replay {
		select {
		case c.replays <- d:
		default: // the replayer is behind; skip this copy
		}
	}
	return nil
}

// replayer publishes the copies handle asks for: the same message-id,
// properties, headers and body, to the same exchange and routing key, as
// the relay sends a message again after a restart. The single worker takes
// a copy only after the original's transaction has finished, so the inbox
// finds the copy processed and skips it.
func (c *consumer) replayer(ctx context.Context) {
	defer close(c.replayDone)
	for {
		select {
		case <-ctx.Done():
			return
		case d := <-c.replays:
			err := c.pub.PublishWithContext(ctx, d.Exchange, d.RoutingKey, false, false, amqp.Publishing{
				Headers: d.Headers, ContentType: d.ContentType, DeliveryMode: d.DeliveryMode,
				MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, Body: d.Body,
			})
			if err != nil {
				fmt.Printf("replay %s: %v\n", d.MessageId, err)
				continue
			}
			c.mu.Lock()
			c.replayed++
			c.mu.Unlock()
			fmt.Printf("replayed  %-14s id=%s (a copy, as after a relay restart: the inbox will skip it)\n", d.Type, d.MessageId)
		}
	}
}

// committing records that the producer is about to commit message id.
func (c *consumer) committing(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.committed[id] = time.Now()
	c.pending[id] = true
}

// finished reports whether all sent messages were handled and every copy
// published was skipped.
func (c *consumer) finished(sent int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.committed) == sent && len(c.pending) == 0 && c.consumer.Stats().Duplicates >= int64(c.replayed)
}

// stop ends the consumer: the message in flight finishes and is acked.
func (c *consumer) stop() error {
	c.cancel()
	err := <-c.done
	c.done <- err
	<-c.replayDone
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	return nil
}

// summary prints what happened to the messages of this run.
func (c *consumer) summary(sent int, effects int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.consumer.Stats()
	fmt.Printf("sent %d; inbox: processed %d, duplicates skipped %d (of %d copies replayed), failed %d; effects committed %d\n",
		sent, s.Processed, s.Duplicates, c.replayed, s.Failed, effects)
	l := slices.Clone(c.latencies)
	slices.Sort(l)
	if len(l) == 0 {
		return
	}
	pct := func(p float64) float64 { return float64(l[int(p*float64(len(l)-1))].Microseconds()) / 1000 }
	fmt.Printf("commit → receive latency p50 %.2fms p99 %.2fms max %.2fms\n", pct(0.5), pct(0.99), pct(1))
}
