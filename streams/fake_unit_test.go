package streams

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/publish"
)

// fakeClient opens fakeProducers in place of the broker.
type fakeClient struct {
	mu     sync.Mutex
	opened []*fakeProducer
	opts   []*stream.ProducerOptions
}

func (c *fakeClient) open(streamName string, opts *stream.ProducerOptions) (clientProducer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fp := &fakeProducer{closeEv: make(chan stream.Event, 1), confirms: make(stream.ChannelPublishConfirm)}
	c.opened = append(c.opened, fp)
	c.opts = append(c.opts, opts)
	return fp, nil
}

func (c *fakeClient) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.opened)
}

// fakeProducer records what is sent and confirms nothing; drop makes it
// fail as a lost connection does; block makes Send hang until released.
type fakeProducer struct {
	mu       sync.Mutex
	sent     int
	closeEv  chan stream.Event
	confirms stream.ChannelPublishConfirm
	block    chan struct{}
	once     sync.Once
}

func (f *fakeProducer) Send(message.StreamMessage) error {
	f.mu.Lock()
	f.sent++
	block := f.block
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	return nil
}

func (f *fakeProducer) NotifyPublishConfirmation() stream.ChannelPublishConfirm {
	return f.confirms
}

func (f *fakeProducer) NotifyClose() stream.ChannelClose { return f.closeEv }

func (f *fakeProducer) Close() error {
	f.once.Do(func() { close(f.closeEv); close(f.confirms) }) // as the client's close does
	return nil
}

func (f *fakeProducer) drop() {
	f.closeEv <- stream.Event{Reason: "socket closed", Err: errors.New("injected: connection lost")}
}

func (f *fakeProducer) sentCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent
}

type zeroQuerier struct{}

func (zeroQuerier) QuerySequence(string, string) (int64, error) { return 0, nil }

func fakePublisher(t *testing.T, window int) (*Publisher, *fakeClient) {
	t.Helper()
	fc := &fakeClient{}
	p := newPublisher(Config{Stream: "s", Partitions: 1, Producer: "d", Window: window}, zeroQuerier{}, nil, NewIssued(), 1)
	p.open = fc.open
	t.Cleanup(func() { _ = p.Close() })
	return p, fc
}

func waitFailed(t *testing.T, pr *Producer) {
	t.Helper()
	select {
	case <-pr.Failed():
	case <-time.After(2 * time.Second):
		t.Fatal("the producer did not fail")
	}
}

func msg(key, id string) publish.Message {
	var m publish.Message
	m.Key = key
	m.Publishing.MessageId = id
	return m
}

// Finding A: a round claims K:m1,m2,m3; m1 is sent on P0, whose connection
// drops before m1 is stored. The round's next publish must not open a
// replacement P0' and store m2, m3 there (the rolled-back round would then
// publish m1..m3 again: the stream would read m2 m3 m1 m2 m3). It returns
// the failure; the next round replaces P0.
func TestUnitRouterEndsTheRoundOnAFailedProducer(t *testing.T) {
	p, fc := fakePublisher(t, 8)
	ctx := context.Background()
	r := p.NewRouter("d", "", func(publish.Result) {})
	if err := r.Publish(ctx, msg("K", "m1")); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p0 := p.producers["d-0"]
	p.mu.Unlock()
	fc.opened[0].drop()
	waitFailed(t, p0)

	if err := r.Publish(ctx, msg("K", "m2")); !errors.Is(err, ErrFailed) {
		t.Fatalf("Publish(m2) in the round of a failed producer: %v, want its failure", err)
	}
	if fc.count() != 1 {
		t.Fatalf("%d producers opened in the round: a replacement took the round's later messages", fc.count())
	}

	// The round is abandoned on the error (poller/round.go, without a
	// Flush); the next round (republishing m1..m3) gets a replacement
	// numbering above the failed one.
	if err := r.Publish(ctx, msg("K", "m1")); err != nil {
		t.Fatalf("first publish of the next round: %v", err)
	}
	if fc.count() != 2 || fc.opened[1].sentCount() != 1 {
		t.Fatalf("next round: %d producers opened", fc.count())
	}
	p.mu.Lock()
	p1 := p.producers["d-0"]
	p.mu.Unlock()
	if p1 == p0 || p1.Last() <= p0.Last() {
		t.Fatalf("replacement: last id %d, failed one's %d", p1.Last(), p0.Last())
	}
}

// A failure the round learns of at its Flush ends the round the same way:
// Flush returns it, and the next round's first publish replaces the
// producer.
func TestUnitRouterReplacesAFailedProducerAfterFlush(t *testing.T) {
	p, fc := fakePublisher(t, 8)
	ctx := context.Background()
	r := p.NewRouter("d", "", func(publish.Result) {})
	if err := r.Publish(ctx, msg("K", "m1")); err != nil {
		t.Fatal(err)
	}
	fc.opened[0].drop()
	fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := r.Flush(fctx); !errors.Is(err, ErrFailed) {
		t.Fatalf("Flush: %v, want the failure", err)
	}
	if err := r.Publish(ctx, msg("K", "m1")); err != nil {
		t.Fatalf("next round: %v", err)
	}
	if fc.count() != 2 {
		t.Fatalf("%d producers opened, want a replacement", fc.count())
	}
}

// stuckQuerier is a broker call that never returns (the client's locator
// reconnection loop while the broker is unreachable).
type stuckQuerier struct{}

func (stuckQuerier) QuerySequence(string, string) (int64, error) { select {} }

// Finding B: Close does not wait without bound for a broker call that
// never returns, and a caller waiting to open a producer behind it gives
// up with its context.
func TestUnitCloseDoesNotWaitForAStuckCall(t *testing.T) {
	p := newPublisher(Config{Stream: "s", Partitions: 1, Producer: "d", Window: 8}, stuckQuerier{}, nil, nil, 1)
	fc := &fakeClient{}
	p.open = fc.open
	p.callsWait = 100 * time.Millisecond

	started := make(chan struct{})
	go func() { // leaks with the stuck call, as in production
		close(started)
		_, _ = p.StartFresh(context.Background(), "d-0", 0)
	}()
	<-started
	time.Sleep(20 * time.Millisecond) // the query is under way, the opening slot taken

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.StartFresh(ctx, "d-0", 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("opening behind a stuck call: %v, want the context's error", err)
	}

	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err == nil {
			t.Error("Close says nothing of the call left behind")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close waits for a broker call that never returns")
	}
}

// Finding D: the client's queue of messages not yet written (sized by the
// batch size) holds a whole window, so Send never blocks on it; a Publish
// waiting behind a Send gives up with its context.
func TestUnitSendDoesNotBlockTheLane(t *testing.T) {
	for _, w := range []int{1, 100, 256, 5000, MaxWindow} {
		c := Config{Window: w}
		if b := c.producerOptions("d-0").BatchSize; b < w || b > MaxWindow {
			t.Errorf("window %d: batch size (client queue) %d", w, b)
		}
	}
	if err := (Config{Stream: "s", Partitions: 1, Producer: "d", URL: "rabbitmq-stream://h:5552/", Window: MaxWindow + 1}).Validate(); err == nil {
		t.Error("a window above the client's queue was accepted")
	}

	p, fc := fakePublisher(t, 8)
	ctx := context.Background()
	pr, err := p.StartFresh(ctx, "d-0", 0)
	if err != nil {
		t.Fatal(err)
	}
	fp := fc.opened[0]
	fp.mu.Lock()
	fp.block = make(chan struct{})
	fp.mu.Unlock()
	defer close(fp.block)
	go func() { _ = pr.Publish(ctx, msg("K", "m1"), func(publish.Result) {}) }() // stuck in Send until the test ends
	time.Sleep(20 * time.Millisecond)
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- pr.Publish(wctx, msg("K", "m2"), func(publish.Result) {}) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Publish behind a stuck Send: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Publish ignores its context behind a stuck Send")
	}
}

// P0 fails while the round's next Publish waits for the opening slot
// (another worker opening a producer), after it found no failure: the
// opening replaces P0, but m2 must not go to the replacement (stored while
// m1, on P0, was not: the retried round would make the stream read m2 m1
// m2). Publish returns P0's failure.
func TestUnitRouterEndsTheRoundOnAFailureWhileOpening(t *testing.T) {
	p, fc := fakePublisher(t, 8)
	ctx := context.Background()
	r := p.NewRouter("d", "", func(publish.Result) {})
	if err := r.Publish(ctx, msg("K", "m1")); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p0 := p.producers["d-0"]
	p.mu.Unlock()

	p.opening <- struct{}{} // another worker opens a producer
	done := make(chan error, 1)
	go func() { done <- r.Publish(ctx, msg("K", "m2")) }()
	time.Sleep(20 * time.Millisecond) // Publish(m2) waits in lockOpen
	fc.opened[0].drop()
	waitFailed(t, p0)
	p.unlockOpen()

	select {
	case err := <-done:
		if !errors.Is(err, ErrFailed) {
			t.Fatalf("Publish(m2) after P0 failed under it: %v, want P0's failure", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Publish(m2) hangs")
	}
	fc.mu.Lock()
	opened := append([]*fakeProducer(nil), fc.opened...)
	fc.mu.Unlock()
	for i, fp := range opened[1:] {
		if n := fp.sentCount(); n != 0 {
			t.Fatalf("replacement %d of P0 took %d of the round's messages", i+1, n)
		}
	}
}
