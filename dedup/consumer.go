package dedup

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// DeliveryHandler does the database work of one delivery in tx (see
// Handler: it must not commit or roll back tx).
type DeliveryHandler func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error

// Defaults of the Consumer's zero fields.
const (
	DefaultPrefetch    = 16
	DefaultWorkers     = 1
	DefaultMaxAttempts = 5
	DefaultRetryDelay  = time.Second
)

// Consumer consumes one queue through an Inbox: each delivery's handler runs
// in the inbox's transaction, and the delivery is acked only after that
// transaction committed (or found the message processed already). Set the
// fields, then call Run; do not change them while Run runs.
//
// Failures: a handler error (or a database error) counts as one attempt in
// the table message_inbox_attempts, in its own transaction, and the delivery
// is returned to the queue (basic.nack, requeue) after RetryDelay. The
// attempt that reaches MaxAttempts copies the message into outbox_failed
// (source 'inbox') and acks it. The count lives in the database, so it
// survives restarts and is shared by every process of the consumer.
//
// Messages that no attempt can fix are not retried: a message type with no
// entry in Handlers and no Unknown handler, and a message-id that is not a
// UUID (it cannot be deduplicated), go to outbox_failed at once, with the
// reason, and are acked. They never vanish and never block the queue.
type Consumer struct {
	// Inbox records what was processed. Required.
	Inbox *Inbox
	// Queue is the queue to consume. Required.
	Queue string
	// Handlers maps a message type (the AMQP type property, the outbox's
	// message_type) to its handler.
	Handlers map[string]DeliveryHandler
	// Unknown, when set, handles the types Handlers lacks. When nil such a
	// message goes to outbox_failed with the error
	// `no handler for message type "T"` and is acked.
	Unknown DeliveryHandler
	// Prefetch is the basic.qos prefetch count: how many unacked deliveries
	// the broker sends ahead. 0 means DefaultPrefetch.
	Prefetch int
	// Workers is how many messages are processed at once. 0 means
	// DefaultWorkers (one: in delivery order). Deliveries are spread by
	// their x-partition-key header, so messages of one partition key are
	// processed one after the other in delivery order; messages without a
	// key go to the workers in turn.
	Workers int
	// MaxAttempts is how many failed attempts a message gets before it goes
	// to outbox_failed. 0 means DefaultMaxAttempts.
	MaxAttempts int
	// RetryDelay is how long a failed delivery is held before it goes back
	// to the queue, so a database outage does not turn into a busy loop of
	// redeliveries. 0 means DefaultRetryDelay; negative means none.
	RetryDelay time.Duration
	// Tag is the consumer tag; "" means one made of the consumer's name and
	// random bits.
	Tag string
	// Logger receives failures (Warn) and messages given up on (Error).
	// nil means no logging.
	Logger *slog.Logger
	// TracerProvider makes the consumer span each delivery's handler runs
	// in: "process <Queue>", kind consumer, a child of (and linked to) the
	// producer's span whose W3C trace context (traceparent, tracestate,
	// baggage) outbox.Enqueue put in the headers. nil means the global
	// otel.GetTracerProvider(), which makes no spans unless the application
	// installed one.
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from the AMQP headers. nil means
	// outbox.DefaultPropagator(): W3C Trace Context and W3C Baggage.
	Propagator propagation.TextMapPropagator

	stats struct{ processed, duplicates, retried, failed atomic.Int64 }
	// afterCommit, when set (by tests), runs after a delivery's
	// transaction committed and before its ack.
	afterCommit func(amqp.Delivery)
}

// Stats counts what became of the deliveries a Consumer handled, over all
// its Runs.
type Stats struct {
	Processed  int64 // handler ran and committed; acked
	Duplicates int64 // processed before, handler skipped; acked
	Retried    int64 // failed; returned to the queue for another attempt
	Failed     int64 // copied to outbox_failed (attempts exhausted, unknown type, bad id); acked
}

// Stats returns the counts so far.
func (c *Consumer) Stats() Stats {
	return Stats{
		Processed:  c.stats.processed.Load(),
		Duplicates: c.stats.duplicates.Load(),
		Retried:    c.stats.retried.Load(),
		Failed:     c.stats.failed.Load(),
	}
}

// Run consumes c.Queue on ch with manual acks until ctx ends or ch closes.
// The caller owns ch (and its connection): Run sets its prefetch and
// consumes on it; after an error, open a new channel and call Run again.
//
// Stop: when ctx ends Run cancels the consumer (basic.cancel), lets the
// handlers that are running finish and ack what they committed, returns
// the deliveries that had not started to the queue (basic.nack, requeue),
// and returns nil. Handlers run with a context that does not end with ctx,
// so a transaction is never cut in the middle; a handler that may block
// must bound itself. Nothing is acked that did not commit: when ch closes
// under Run, the broker requeues every unacked delivery, and the inbox
// skips the ones that had committed when they come again.
func (c *Consumer) Run(ctx context.Context, ch *amqp.Channel) error {
	prefetch, workers, err := c.settings()
	if err != nil {
		return err
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fmt.Errorf("dedup: consumer %q: set prefetch %d: %w", c.Inbox.consumer, prefetch, err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	tag := c.Tag
	if tag == "" {
		tag = consumerTag(c.Inbox.consumer)
	}
	deliveries, err := ch.Consume(c.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("dedup: consumer %q: consume queue %q: %w", c.Inbox.consumer, c.Queue, err)
	}

	// stop is closed when no delivery may start any more: ctx ended or ch
	// closed. Work already started finishes on its own context.
	stop := make(chan struct{})
	var errs firstError
	var wg sync.WaitGroup
	lanes := c.startWorkers(context.WithoutCancel(ctx), stop, workers, prefetch, &wg, errs.report)
	runErr := c.dispatch(ctx, closed, deliveries, lanes)
	close(stop)
	if runErr == nil {
		// Stop the broker's deliveries; those already sent to us come out
		// of deliveries until amqp091 closes it after basic.cancel-ok (or
		// at once when the channel is gone).
		if err := ch.Cancel(tag, false); err != nil && !ch.IsClosed() {
			errs.report(fmt.Errorf("dedup: consumer %q: cancel consumer %q: %w", c.Inbox.consumer, tag, err))
		}
	}
	for d := range deliveries {
		c.requeue(d, errs.report)
	}
	for _, l := range lanes {
		close(l)
	}
	wg.Wait()
	if runErr != nil {
		return runErr
	}
	return errs.first() // nil on a clean stop; else an ack or nack that failed
}

// settings checks c and returns its prefetch and workers, defaults filled.
func (c *Consumer) settings() (prefetch, workers int, err error) {
	if c.Inbox == nil || c.Queue == "" {
		return 0, 0, errors.New("dedup: Consumer needs an Inbox and a Queue")
	}
	if err := checkName("consumer name", c.Inbox.consumer); err != nil {
		return 0, 0, fmt.Errorf("dedup: %w", err)
	}
	if c.Prefetch < 0 || c.Workers < 0 || c.MaxAttempts < 0 {
		return 0, 0, fmt.Errorf("dedup: consumer %q: Prefetch, Workers and MaxAttempts must not be negative", c.Inbox.consumer)
	}
	return orDefault(c.Prefetch, DefaultPrefetch), orDefault(c.Workers, DefaultWorkers), nil
}

// startWorkers starts workers goroutines (counted in wg), each handling the
// deliveries of its lane on work until the lane is closed; once stop is
// closed, they requeue instead. Each lane can hold every unacked delivery
// (prefetch): the dispatcher never waits on a busy worker.
func (c *Consumer) startWorkers(work context.Context, stop <-chan struct{}, workers, prefetch int, wg *sync.WaitGroup, report func(error)) []chan amqp.Delivery {
	lanes := make([]chan amqp.Delivery, workers)
	for i := range lanes {
		lanes[i] = make(chan amqp.Delivery, prefetch)
		wg.Go(func() {
			for d := range lanes[i] {
				select {
				case <-stop:
					c.requeue(d, report)
				default:
					c.handle(work, stop, d, report)
				}
			}
		})
	}
	return lanes
}

// dispatch hands each delivery to the lane of its partition key until ctx
// ends (nil) or the channel or the consumer ends (the error says which).
func (c *Consumer) dispatch(ctx context.Context, closed <-chan *amqp.Error, deliveries <-chan amqp.Delivery, lanes []chan amqp.Delivery) error {
	next := 0 // the worker for the next delivery without a partition key
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-closed:
			if e != nil {
				return fmt.Errorf("dedup: consumer %q: channel closed: %w", c.Inbox.consumer, e)
			}
			return fmt.Errorf("dedup: consumer %q: channel closed by the application", c.Inbox.consumer)
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("dedup: consumer %q: consuming queue %q ended (channel closed, or the broker cancelled the consumer)", c.Inbox.consumer, c.Queue)
			}
			lanes[lane(d, len(lanes), &next)] <- d
		}
	}
}

// firstError keeps the first error reported from several goroutines.
type firstError struct {
	mu  sync.Mutex
	err error
}

func (f *firstError) report(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *firstError) first() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// lane picks the worker of d: by a hash of its partition key, so one key's
// messages keep their delivery order, or in turn when it has none.
func lane(d amqp.Delivery, workers int, next *int) int {
	if workers == 1 {
		return 0
	}
	if key, _ := d.Headers[headerPartitionKey].(string); key != "" {
		h := fnv.New32a()
		h.Write([]byte(key))
		return int(h.Sum32() % uint32(workers))
	}
	*next = (*next + 1) % workers
	return *next
}

// handle processes one delivery and acks or requeues it, in the
// delivery's consumer span.
func (c *Consumer) handle(ctx context.Context, stop <-chan struct{}, d amqp.Delivery, report func(error)) {
	ctx, span := c.startSpan(ctx, d)
	defer span.End()
	c.process(ctx, stop, d, report)
}

// process processes one delivery and acks or requeues it.
func (c *Consumer) process(ctx context.Context, stop <-chan struct{}, d amqp.Delivery, report func(error)) {
	id, err := outbox.ParseMessageID(d.MessageId)
	if err != nil {
		c.giveUpAndAck(ctx, stop, d, outbox.MessageID{}, 0, "",
			fmt.Sprintf("message-id %q is not a UUID: the inbox cannot deduplicate it", d.MessageId), report)
		return
	}
	h := c.Handlers[d.Type]
	if h == nil {
		h = c.Unknown
	}
	if h == nil {
		c.giveUpAndAck(ctx, stop, d, id, 0, "", fmt.Sprintf("no handler for message type %q", d.Type), report)
		return
	}

	done, err := c.Inbox.process(ctx, id, d.Type, func(ctx context.Context, tx *sql.Tx) error {
		if err := h(ctx, tx, d); err != nil {
			return err
		}
		// Only a redelivery can have failed attempts on record: they go
		// with the success.
		if d.Redelivered {
			return clearAttempts(ctx, tx, c.Inbox.consumer, id)
		}
		return nil
	})
	if err == nil {
		if done {
			c.stats.processed.Add(1)
		} else {
			c.stats.duplicates.Add(1)
		}
		if c.afterCommit != nil {
			c.afterCommit(d)
		}
		if err := d.Ack(false); err != nil {
			report(fmt.Errorf("dedup: consumer %q: ack message %s: %w", c.Inbox.consumer, id, err))
		}
		return
	}

	// Failed: count the attempt, then retry or give up.
	spanFailed(ctx, err)
	n, cerr := countAttempt(ctx, c.Inbox.db, c.Inbox.consumer, id, err)
	if cerr != nil {
		c.log(slog.LevelWarn, "message failed; its attempt could not be counted", d, err, slog.Any("count_error", cerr))
		c.retryLater(stop, d, report)
		return
	}
	if maxAttempts := orDefault(c.MaxAttempts, DefaultMaxAttempts); int(n) >= maxAttempts {
		c.giveUpAndAck(ctx, stop, d, id, n, err.Error(), fmt.Sprintf("consumer %q: %d failed attempts, the last: %v", c.Inbox.consumer, n, err), report)
		return
	}
	c.log(slog.LevelWarn, "message failed; it goes back to the queue", d, err, slog.Int64("attempts", n))
	c.retryLater(stop, d, report)
}

// giveUpAndAck copies d into outbox_failed and acks it; when that fails it
// goes back to the queue for another try.
func (c *Consumer) giveUpAndAck(ctx context.Context, stop <-chan struct{}, d amqp.Delivery, id outbox.MessageID, attempts int64, lastErr, reason string, report func(error)) {
	if err := giveUp(ctx, c.Inbox.db, c.Inbox.consumer, d, id, attempts, lastErr, reason); err != nil {
		c.log(slog.LevelWarn, "message could not be moved to "+FailedTable+"; it goes back to the queue", d, err)
		c.retryLater(stop, d, report)
		return
	}
	c.stats.failed.Add(1)
	spanFailed(ctx, errors.New(reason))
	c.log(slog.LevelError, "message given up: copied to "+FailedTable, d, errors.New(reason))
	if err := d.Ack(false); err != nil {
		report(fmt.Errorf("dedup: consumer %q: ack message %q after moving it to %s: %w", c.Inbox.consumer, d.MessageId, FailedTable, err))
	}
}

// retryLater returns d to the queue after RetryDelay, or at once when the
// consumer stops.
func (c *Consumer) retryLater(stop <-chan struct{}, d amqp.Delivery, report func(error)) {
	c.stats.retried.Add(1)
	delay := c.RetryDelay
	if delay == 0 {
		delay = DefaultRetryDelay
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
		}
	}
	c.requeue(d, report)
}

// requeue returns d to the queue unprocessed.
func (c *Consumer) requeue(d amqp.Delivery, report func(error)) {
	if err := d.Nack(false, true); err != nil {
		report(fmt.Errorf("dedup: consumer %q: return message %q to the queue: %w", c.Inbox.consumer, d.MessageId, err))
	}
}

func (c *Consumer) log(level slog.Level, msg string, d amqp.Delivery, err error, attrs ...slog.Attr) {
	if c.Logger == nil {
		return
	}
	attrs = append(attrs,
		slog.String("consumer", c.Inbox.consumer),
		slog.String("message_id", d.MessageId),
		slog.String("type", d.Type),
		slog.Bool("redelivered", d.Redelivered),
		slog.Any("error", err))
	c.Logger.LogAttrs(context.Background(), level, msg, attrs...)
}

// consumerTag makes a tag naming the consumer, unique per call.
func consumerTag(consumer string) string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	// A tag is an AMQP short string: at most 255 bytes.
	tag := "dedup." + consumer
	for len(tag) > 200 {
		_, size := utf8.DecodeLastRuneInString(tag)
		tag = tag[:len(tag)-size]
	}
	return tag + "." + hex.EncodeToString(b[:])
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}
