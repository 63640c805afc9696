package streams

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// closingProducer is a client producer whose Close behaves as the client's
// (v1.8.3) does: it sends the close event, then n batches of
// confirmations (the messages it never wrote, the unconfirmed ones it
// flushes) into the one-batch confirmation channel, then closes it; with
// block set it first blocks until block is closed (a batch writer stuck on
// a stalled socket holding the lock the close needs).
type closingProducer struct {
	confirms chan []*stream.ConfirmationStatus
	closeEv  chan stream.Event
	n        int
	block    chan struct{}
	returned chan struct{} // closed when Close returns
}

func newClosingProducer(n int, block chan struct{}) *closingProducer {
	return &closingProducer{confirms: make(chan []*stream.ConfirmationStatus, 1), closeEv: make(chan stream.Event, 1),
		n: n, block: block, returned: make(chan struct{})}
}

func (c *closingProducer) Send(message.StreamMessage) error { return nil }
func (c *closingProducer) NotifyPublishConfirmation() stream.ChannelPublishConfirm {
	return c.confirms
}
func (c *closingProducer) NotifyClose() stream.ChannelClose { return c.closeEv }
func (c *closingProducer) Close() error {
	defer close(c.returned)
	if c.block != nil {
		<-c.block
	}
	c.closeEv <- stream.Event{Reason: stream.DeletePublisher}
	close(c.closeEv)
	for i := 0; i < c.n; i++ {
		c.confirms <- []*stream.ConfirmationStatus{{}}
	}
	close(c.confirms)
	return nil
}

func closingPublisher(t *testing.T, cps ...*closingProducer) *Publisher {
	t.Helper()
	p := newPublisher(Config{Stream: "s", Partitions: len(cps), Producer: "d", Window: 8}, zeroQuerier{}, nil, nil, 1)
	p.callsWait = 300 * time.Millisecond
	next := 0
	p.open = func(string, *stream.ProducerOptions) (clientProducer, error) {
		cp := cps[next]
		next++
		return cp, nil
	}
	for i := range cps {
		if _, err := p.Producer(context.Background(), "d", i); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func closeWithin(t *testing.T, p *Publisher, bound time.Duration) error {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		return err
	case <-time.After(bound):
		t.Fatal("Publisher.Close hangs")
		return nil
	}
}

// The client's close sends the messages it never wrote and the flushed
// unconfirmed ones to the confirmation channel after the close event: the
// confirmation goroutine keeps reading them until the client closes the
// channel, so the client's close returns.
func TestUnitCloseDrainsConfirmationsAfterTheCloseEvent(t *testing.T) {
	cp := newClosingProducer(5, nil)
	p := closingPublisher(t, cp)
	if err := closeWithin(t, p, 2*time.Second); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-cp.returned:
	default:
		t.Fatal("the client's close did not return: nobody read its confirmations")
	}
}

// A client producer whose close never returns (a stalled socket) does not
// hold Publisher.Close beyond its one deadline, shared by all the
// producers; the error names the producer left running. The other
// producers are closed meanwhile.
func TestUnitCloseDoesNotWaitForAStuckProducerClose(t *testing.T) {
	block := make(chan struct{})
	defer close(block) // lets the left-behind close end with the test
	stuck, other, stuck2 := newClosingProducer(0, block), newClosingProducer(3, nil), newClosingProducer(0, block)
	p := closingPublisher(t, stuck, other, stuck2)
	start := time.Now()
	err := closeWithin(t, p, 2*time.Second)
	if d := time.Since(start); d > 2*p.callsWait {
		t.Fatalf("Close took %v: the producers' closes were waited for one after another", d)
	}
	if err == nil || !strings.Contains(err.Error(), "d-0") || !strings.Contains(err.Error(), "d-2") || !strings.Contains(err.Error(), "left running") {
		t.Fatalf("Close: %v, want an error naming the producers left running", err)
	}
	select {
	case <-other.returned:
	default:
		t.Fatal("the other producer was not closed")
	}
}

// Replacing a failed producer whose client close never returns does not
// hold the opening slot: the close runs on, and Publisher.Close waits for
// it within its deadline and names it.
func TestUnitReplacingDoesNotWaitForTheFailedProducersClose(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	stuck, next := newClosingProducer(0, block), newClosingProducer(0, nil)
	p := closingPublisher(t, stuck)
	p.open = func(string, *stream.ProducerOptions) (clientProducer, error) { return next, nil }
	p.mu.Lock()
	p0 := p.producers["d-0"]
	p.mu.Unlock()
	stuck.closeEv <- stream.Event{Reason: stream.SocketClosed}
	waitFailed(t, p0)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	pr, err := p.StartFresh(ctx, "d-0", 0)
	if err != nil || pr == p0 {
		t.Fatalf("StartFresh after a failure: %v", err)
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Fatalf("replacing took %v: it waited for the failed producer's close", d)
	}
	err = closeWithin(t, p, 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "d-0") || !strings.Contains(err.Error(), "left running") {
		t.Fatalf("Close: %v, want an error naming the replaced producer's close left running", err)
	}
}
