package streams

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/publish"
)

// Producer publishes into one partition stream under one producer name.
// Publish sends asynchronously, and every message it accepted gets exactly
// one publish.Result through the callback given with it, unless the
// Producer fails or is closed first. Publish may be called from several
// goroutines: the id is assigned and the message queued under one lock, so
// ids reach the broker in increasing order. Results come from the
// Producer's own goroutine, in publishing-id order.
type Producer struct {
	name, stream string
	p            clientProducer
	window       chan struct{} // one token per unconfirmed message

	// send is held (its one slot taken) from assigning an id to queueing
	// the message; a channel so that waiting for it ends with the
	// caller's context.
	send chan struct{}

	mu      sync.Mutex
	tags    map[int64]waiting // publishing id → the message's tag and callback, of unconfirmed messages
	last    uint64            // the highest id sent
	err     error
	failed  chan struct{} // closed at the first failure
	idle    chan struct{} // closed and replaced whenever tags empties
	done    chan struct{} // closed when the confirmation loop ends
	closing bool

	closeOnce    sync.Once
	clientClosed chan struct{} // closed when the client's Close has returned
	closeErr     error         // its error (read once clientClosed is closed)
	quitOnce     sync.Once
	quit         chan struct{} // closed when a Close gives up waiting: the confirmation loop stops draining

	issued *Issued // the process's record of ids given per name (may be nil)

	// fresh: StartFresh has made it number above FreshAfter
	// (with the Publisher's opening slot taken).
	fresh bool
}

// clientProducer is the client's producer as a Producer uses it
// (*stream.Producer; a fake in unit tests).
type clientProducer interface {
	Send(message.StreamMessage) error
	NotifyPublishConfirmation() stream.ChannelPublishConfirm
	NotifyClose() stream.ChannelClose
	Close() error
}

// waiting is an unconfirmed message's tag and callback.
type waiting struct {
	tag any
	cb  func(publish.Result)
	at  time.Time // when it was sent
}

// ErrFailed is matched (errors.Is) by every failure of a Producer: a
// message the broker did not confirm, the connection lost, the producer
// closed under it. So is publish.ErrClosed.
var ErrFailed = errors.New("stream producer failed")

func newProducer(p clientProducer, name, streamName string, window int, issued *Issued) *Producer {
	pr := &Producer{
		name: name, stream: streamName, p: p, issued: issued, send: make(chan struct{}, 1),
		window: make(chan struct{}, window), tags: map[int64]waiting{},
		failed: make(chan struct{}), idle: make(chan struct{}), done: make(chan struct{}),
		clientClosed: make(chan struct{}), quit: make(chan struct{}),
	}
	go pr.confirmations(p.NotifyPublishConfirmation(), p.NotifyClose())
	return pr
}

// Name is the producer's name ("<relay-name>-<i>").
func (pr *Producer) Name() string { return pr.name }

// Failed is closed once the producer has failed; Err says why.
func (pr *Producer) Failed() <-chan struct{} { return pr.failed }

// Err is why the producer failed (wrapping ErrFailed), nil before.
func (pr *Producer) Err() error {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.err
}

// Last is the highest publishing id sent so far (0 before the first).
func (pr *Producer) Last() uint64 {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.last
}

// StartAbove makes the ids Publish assigns (m.Seq 0) start above last,
// when that is above the highest sent so far: the broker's last id for
// this producer, so that no message is dropped as a false duplicate.
func (pr *Producer) StartAbove(last uint64) {
	pr.send <- struct{}{}
	defer func() { <-pr.send }()
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.last = max(pr.last, last)
}

// Publish sends m with publishing id m.Seq, or, when m.Seq is 0, with the id
// after the highest sent so far; cb gets its result. Ids must strictly
// increase: an id at or below the highest sent is refused (the broker would
// drop the message as a duplicate). It blocks while Config.Window messages
// are unconfirmed and returns ctx's error when ctx ends first, and the
// failure once the producer has failed.
func (pr *Producer) Publish(ctx context.Context, m publish.Message, cb func(publish.Result)) error {
	select {
	case pr.window <- struct{}{}:
	case <-pr.failed:
		return pr.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case pr.send <- struct{}{}:
	case <-pr.failed:
		<-pr.window
		return pr.Err()
	case <-ctx.Done():
		<-pr.window
		return ctx.Err()
	}
	defer func() { <-pr.send }()
	pr.mu.Lock()
	if pr.err != nil {
		pr.mu.Unlock()
		<-pr.window
		return pr.err
	}
	id := m.Seq
	if id == 0 {
		id = pr.last + 1
	}
	if id <= pr.last {
		pr.mu.Unlock()
		<-pr.window
		return fmt.Errorf("stream producer %s: publishing id %d is not above the last sent, %d: the broker would drop it", pr.name, id, pr.last)
	}
	pr.last = id
	pr.issued.Note(pr.name, id)
	pr.tags[int64(id)] = waiting{tag: m.Tag, cb: cb, at: time.Now()}
	pr.mu.Unlock()
	// Send only queues (the client batches); order of Send calls is the
	// order on the wire. It does not take a context, but it does not
	// block: the client's queue holds a whole window (producerOptions),
	// and at most a window of messages is unconfirmed.
	if err := pr.p.Send(Encode(m, id)); err != nil && !errors.Is(err, stream.FrameTooLarge) {
		pr.fail(fmt.Errorf("send publishing id %d to %s: %w", id, pr.stream, err))
		return pr.Err()
	}
	return nil
}

// confirmations resolves messages as the broker confirms them (also those it
// dropped as duplicates: they are stored already). A message too large for
// a frame is Returned (it goes to outbox_failed; its id stays unused, which
// the broker allows). Anything else unconfirmed, or the producer closed
// under it, fails the producer. The loop is the Producer's: it ends when
// the client closes the confirmation channel, or when a Close gives up
// waiting for that (quit).
func (pr *Producer) confirmations(confirms stream.ChannelPublishConfirm, closed stream.ChannelClose) {
	defer close(pr.done)
	for {
		select {
		case batch, ok := <-confirms:
			if !ok {
				pr.fail(fmt.Errorf("producer %s on %s: confirmations ended", pr.name, pr.stream))
				return
			}
			for _, cs := range batch {
				pr.resolve(cs)
			}
		case ev, ok := <-closed:
			if !ok {
				pr.fail(fmt.Errorf("producer %s on %s closed", pr.name, pr.stream))
			} else {
				pr.fail(fmt.Errorf("producer %s on %s closed: %s %v", pr.name, pr.stream, ev.Reason, ev.Err))
			}
			pr.drain(confirms)
			return
		}
	}
}

// drain reads what the client still sends on confirms after its close
// event, until it closes confirms or a Close gives up (quit): the client's
// close sends the messages it never wrote and flushes the unconfirmed ones
// there, holding its confirmation lock, and would block forever with
// nobody reading (the channel holds one batch). They get no result: the
// producer has failed, and its caller publishes them again.
func (pr *Producer) drain(confirms stream.ChannelPublishConfirm) {
	for {
		select {
		case _, ok := <-confirms:
			if !ok {
				return
			}
		case <-pr.quit:
			return
		}
	}
}

func (pr *Producer) resolve(cs *stream.ConfirmationStatus) {
	id := cs.GetPublishingId()
	pr.mu.Lock()
	w, ok := pr.tags[id]
	tag := w.tag
	if !ok {
		pr.mu.Unlock()
		return
	}
	var res publish.Result
	switch {
	case cs.IsConfirmed():
		res = publish.Result{Tag: tag, Outcome: publish.Confirmed}
	case errors.Is(cs.GetError(), stream.FrameTooLarge):
		res = publish.Result{Tag: tag, Outcome: publish.Returned, Reason: "message too large for a stream frame: " + cs.GetError().Error()}
	default:
		pr.mu.Unlock()
		pr.fail(fmt.Errorf("publishing id %d on %s not confirmed: %v (code %d)", id, pr.stream, cs.GetError(), cs.GetErrorCode()))
		return
	}
	delete(pr.tags, id)
	if len(pr.tags) == 0 {
		close(pr.idle)
		pr.idle = make(chan struct{})
	}
	pr.mu.Unlock()
	<-pr.window
	w.cb(res)
}

// ConfirmWait is how long the oldest unconfirmed message has waited (0
// when none is unconfirmed).
func (pr *Producer) ConfirmWait() time.Duration {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	var oldest time.Time
	for _, w := range pr.tags {
		if oldest.IsZero() || w.at.Before(oldest) {
			oldest = w.at
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return time.Since(oldest)
}

// fail records the first failure; the caller restarts from its checkpoint.
func (pr *Producer) fail(err error) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.err != nil || pr.closing {
		return
	}
	pr.err = &failure{fmt.Errorf("stream producer %s failed: %w", pr.name, err)}
	close(pr.failed)
}

// failure is a Producer's failure: it matches ErrFailed and
// publish.ErrClosed (the producer publishes nothing more; a poller ends its
// run on it, so the relay restarts the term).
type failure struct{ err error }

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }
func (f *failure) Is(target error) bool {
	return target == ErrFailed || target == publish.ErrClosed
}

// Flush waits until every message sent has its result; it returns the
// failure when the producer fails first, ctx's error when ctx ends.
func (pr *Producer) Flush(ctx context.Context) error {
	for {
		pr.mu.Lock()
		n, idle, err := len(pr.tags), pr.idle, pr.err
		pr.mu.Unlock()
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		select {
		case <-idle:
		case <-pr.failed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close closes the producer and waits for the client's close and the
// confirmation goroutine, at most closeWait (closeBy); messages without a
// result get none.
func (pr *Producer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	return pr.closeBy(ctx)
}

// startClose starts the client's Close, once, and returns at once.
func (pr *Producer) startClose() {
	pr.closeOnce.Do(func() {
		pr.mu.Lock()
		pr.closing = true
		pr.mu.Unlock()
		// The Producer's goroutine; closeBy waits for it until its
		// deadline. Left behind when the client's Close never returns (a
		// batch writer blocked on a stalled socket holds the lock the
		// client's close needs): the client offers no way to abort it.
		go func() {
			pr.closeErr = pr.p.Close()
			close(pr.clientClosed)
		}()
	})
}

// closeBy closes the producer (startClose) and waits until ctx ends for
// the client's Close to return and the confirmation goroutine to end. When
// ctx ends first it returns an error naming what is left running, and the
// confirmation goroutine stops draining.
func (pr *Producer) closeBy(ctx context.Context) error {
	pr.startClose()
	// Past the deadline a select picks at random among ready cases: what
	// has ended is seen first, so a producer that did close is not
	// reported left running.
	select {
	case <-pr.clientClosed:
	default:
		select {
		case <-pr.clientClosed:
		case <-ctx.Done():
			pr.giveUp()
			return fmt.Errorf("close stream producer %s: the client's close still running at the close deadline (%w): left running", pr.name, ctx.Err())
		}
	}
	select {
	case <-pr.done:
	default:
		select {
		case <-pr.done:
		case <-ctx.Done():
			pr.giveUp()
			return fmt.Errorf("close stream producer %s: its confirmations did not end by the close deadline (%w)", pr.name, ctx.Err())
		}
	}
	if err := pr.closeErr; err != nil && !errors.Is(err, stream.AlreadyClosed) {
		return fmt.Errorf("close stream producer %s: %w", pr.name, err)
	}
	return nil
}

// giveUp ends the confirmation goroutine's draining (Close waits no more).
func (pr *Producer) giveUp() { pr.quitOnce.Do(func() { close(pr.quit) }) }

// closeWait bounds Close's wait for the client's close and the
// confirmation goroutine (Publisher.Close: for all of them at once).
const closeWait = 5 * time.Second
