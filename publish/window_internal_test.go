package publish

import (
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// The window counts messages on the wire only. Published key after key, the
// way a bulk backlog reads (a transaction's rows of one key in a row), every
// key's head goes on the wire at once, however many followers of each are
// parked: the count of messages on the wire (sent, without a confirmation)
// reaches the window. When parked messages took window slots, the first
// key's followers filled the window, Publish waited, and one key at a time
// was on the wire.
//
// The callback holds the first Result until every message is published, so
// no confirmation is taken meanwhile: what is on the wire stays on the wire.
func TestWindowCountsMessagesOnTheWire(t *testing.T) {
	b := testenv.RabbitMQ(t)
	const keys, perKey = 10, 20
	ctx := testenv.Context(t, time.Minute)
	p, err := New(ctx, Config{URL: b.URL, ConfirmWindow: keys})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	release := make(chan struct{})
	results := make(chan Result, keys*perKey)
	c, err := p.NewChannel(func(r Result) {
		<-release
		results <- r
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	published := make(chan error, 1)
	go func() {
		for k := range keys {
			for i := range perKey {
				m := Message{Exchange: b.Exchange, RoutingKey: "window", Key: fmt.Sprintf("key-%d", k), Tag: k*perKey + i}
				m.Publishing.MessageId = fmt.Sprintf("window-%d-%d", k, i)
				m.Publishing.Body = []byte("x")
				if err := c.Publish(ctx, m); err != nil {
					published <- fmt.Errorf("publish message %d of key-%d: %w", i, k, err)
					return
				}
			}
		}
		published <- nil
	}()
	// A minute bounds the test; parked messages taking window slots makes
	// Publish wait for a Result the callback holds, forever.
	select {
	case err := <-published:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		close(release)
		c.mu.Lock()
		held := c.queue.len()
		c.mu.Unlock()
		t.Fatalf("Publish still waiting with %d messages held: messages parked behind their key take window slots", held)
	}
	// A key's head is on the wire, or was and has its confirmation (taken
	// off the wire, its Result held by the callback): either way it went
	// out without waiting for another key's confirmation.
	c.mu.Lock()
	heads := c.heads
	sentKeys := map[string]bool{}
	for e := range c.queue.all() {
		if e.tag != 0 || e.resolved {
			sentKeys[e.msg.Key] = true
		}
	}
	sent := len(sentKeys)
	c.mu.Unlock()
	if sent != keys || heads != keys {
		t.Errorf("%d keys' heads sent (%d counted on the wire), want the window: %d, one per key", sent, heads, keys)
	}

	close(release)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	next := make([]int, keys) // per key, the index of the message whose Result comes next
	for n := range keys * perKey {
		r := <-results
		tag, _ := r.Tag.(int)
		k := tag / perKey
		if want := k*perKey + next[k]; r.Tag != want || r.Outcome != Confirmed {
			t.Fatalf("result %d: tag %v outcome %v (%s), want key-%d's next, tag %d, confirmed: in publish order per key", n, r.Tag, r.Outcome, r.Reason, k, want)
		}
		next[k]++
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.heads != 0 || c.held != 0 {
		t.Errorf("after every Result: %d messages counted on the wire, %d bytes held; want 0 and 0", c.heads, c.held)
	}
}
