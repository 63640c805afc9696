package publish

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/backoff"
)

// unitPublish accepts a message of key through the Channel's own path
// (enqueueLocked: keys, heads, held) and, when it goes on the wire, gives
// it the next delivery tag of s as a send would, without an AMQP channel.
// missing resolves it at once as a message to a missing exchange.
func unitPublish(c *Channel, s *session, key string, missing bool) *entry {
	var miss *amqp.Error
	if missing {
		miss = &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange"}
	}
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	e, send := c.enqueueLocked(Message{Key: key, Tag: c.nextSeq + 1}, 0, miss, "")
	if send {
		s.nextTag++
		e.tag = s.nextTag
		s.byTag[e.tag] = e
		e.sentOn = s.conn
	}
	return e
}

// tags is the Tags of results, in the order they were delivered.
func tags(rs []Result) []any {
	out := make([]any, len(rs))
	for i, r := range rs {
		out[i] = r.Tag
	}
	return out
}

func sameTags(got []Result, want ...*entry) bool {
	if len(got) != len(want) {
		return false
	}
	for i, e := range want {
		if got[i].Tag != e.msg.Tag {
			return false
		}
	}
	return true
}

// A nacked message holds back its own key only: while key A's head is
// nacked and waits for its retry, the confirmations of key B's head and of
// a message without a key are delivered as Results at once and their bytes
// are no longer held. A's messages keep their order: a message of A to a
// missing exchange, resolved when published, gets its Result after the
// nacked head's, and A's next message is parked behind the head meanwhile.
// Flush waits for the nacked head, which was published before it.
func TestUnitNackedHeadHoldsBackOnlyItsKey(t *testing.T) {
	p := unitPublisher(t, Config{MaxAttempts: 5, NackGiveUp: time.Hour})
	c := unitChannel(p)
	s := unitSession(&amqp.Connection{}) // no AMQP channel: the test sends nothing for real
	var got []Result
	c.onResult = func(r Result) { got = append(got, r) }

	a1 := unitPublish(c, s, "A", false)
	b1 := unitPublish(c, s, "B", false)
	aMissing := unitPublish(c, s, "A", true)
	free := unitPublish(c, s, "", false)
	a2 := unitPublish(c, s, "A", false) // parked behind a1
	if a1.tag == 0 || b1.tag == 0 || free.tag == 0 || a2.tag != 0 || !aMissing.resolved {
		t.Fatalf("on the wire: a1 %d b1 %d free %d a2 %d (want a2 parked), missing resolved %v",
			a1.tag, b1.tag, free.tag, a2.tag, aMissing.resolved)
	}
	c.deliver() // the kick of the missing exchange
	if len(got) != 0 {
		t.Fatalf("results %v before any confirmation; want none: A's missing-exchange message follows A's head", tags(got))
	}

	// a1 was nacked once before: this nack waits for its retry (a timer)
	// (an hour away) instead of publishing at once.
	a1.attempts = 1
	a1.firstNack = time.Now()
	a1.nackBackoff = backoff.Counter{Min: time.Hour, Max: time.Hour}
	c.confirm(s, amqp.Confirmation{DeliveryTag: a1.tag, Ack: false})
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if a1.retry != nil {
			a1.retry.Stop()
		}
	})
	c.confirm(s, amqp.Confirmation{DeliveryTag: b1.tag, Ack: true})
	c.confirm(s, amqp.Confirmation{DeliveryTag: free.tag, Ack: true})
	if !sameTags(got, b1, free) {
		t.Fatalf("results %v while A's head waits for its retry; want B's and the keyless message's (%v %v) at once",
			tags(got), b1.msg.Tag, free.msg.Tag)
	}
	c.mu.Lock()
	held, want := c.held, a1.size+aMissing.size+a2.size
	c.mu.Unlock()
	if held != want {
		t.Errorf("%d bytes held, want %d: the delivered Results' bytes are freed", held, want)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Flush(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("Flush with A's head unresolved: %v, want it to wait (here: the context's error)", err)
	}

	// The retry goes out (a send on the session, here by hand) and is
	// confirmed: A's Results follow in A's publish order.
	c.mu.Lock()
	a1.retry.Stop()
	a1.retry = nil
	s.nextTag++
	a1.tag = s.nextTag
	s.byTag[a1.tag] = a1
	c.mu.Unlock()
	c.confirm(s, amqp.Confirmation{DeliveryTag: a1.tag, Ack: true})
	if !sameTags(got, b1, free, a1, aMissing) || got[3].Outcome != Returned || got[3].Code != amqp.NotFound {
		t.Fatalf("results %v (%+v); want A's head, then A's missing-exchange message (returned 404), after the others", tags(got), got)
	}
	if !a2.head || a2.resolved {
		t.Fatalf("A's next message: head %v resolved %v; want it A's head, waiting for its send", a2.head, a2.resolved)
	}
	// Flush waits for what was published before it: a2 too.
	if err := c.Flush(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("Flush with a2 unresolved: %v, want the context's error", err)
	}
	c.mu.Lock()
	c.resolveLocked(a2, Confirmed, 0, "")
	c.mu.Unlock()
	c.deliver()
	if err := c.Flush(cancelled); err != nil {
		t.Fatalf("Flush with every Result delivered: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held != 0 || c.heads != 0 || len(c.keys) != 0 {
		t.Errorf("after every Result: %d bytes held, %d heads, %d keys; want none", c.held, c.heads, len(c.keys))
	}
}
