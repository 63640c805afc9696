package publish

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// unitPublisher is a Publisher with no connection, for the logic of
// blame.go on fakes; unitChannel is one of its Channels with no goroutine.
func unitPublisher(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	cfg.URL = "amqp://guest:guest@127.0.0.1:1/"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return &Publisher{cfg: cfg, log: zap.NewNop(), changed: make(chan struct{}), channels: map[*Channel]struct{}{}}
}

func unitChannel(p *Publisher) *Channel {
	c := &Channel{
		p: p, onResult: func(Result) {}, window: p.cfg.ConfirmWindow, maxBytes: p.cfg.MaxHeldBytes,
		log: zap.NewNop(), keys: map[string][]*entry{}, changed: make(chan struct{}),
		kick: make(chan struct{}, 1), done: make(chan struct{}),
	}
	p.channels[c] = struct{}{}
	return c
}

// unitEntry queues a message of key on c as its key's head, sent on conn
// with delivery tag 1 of s.
func unitEntry(c *Channel, s *session, conn *amqp.Connection, key string) *entry {
	c.nextSeq++
	e := &entry{seq: c.nextSeq, msg: Message{Key: key, Tag: c.nextSeq}, size: 1, head: true}
	c.queue.pushBack(e)
	c.keys[key] = append(c.keys[key], e)
	c.heads++
	c.held++
	if s != nil {
		s.nextTag++
		e.tag = s.nextTag
		s.byTag[e.tag] = e
	}
	e.sentOn = conn
	return e
}

// Only the closes a message's own frames can cause count against it:
// RabbitMQ's reader answers a frame over frame_max or with a bad end
// marker with 501, a malformed one with 502 and a frame out of place with
// 505. A channel process that crashed (541: a queue or metadata timeout in
// a node failure), a forced close (320) and the others are the broker's.
func TestUnitBlameConnCodeOnlyFrameFaults(t *testing.T) {
	for code, want := range map[int]bool{
		amqp.FrameError: true, amqp.SyntaxError: true, amqp.UnexpectedFrame: true,
		amqp.InternalError: false, amqp.ResourceError: false, amqp.NotImplemented: false,
		amqp.CommandInvalid: false, amqp.ConnectionForced: false, amqp.NotAllowed: false,
		amqp.AccessRefused: false, amqp.ChannelError: false,
	} {
		if got := blameConnCode(code); got != want {
			t.Errorf("blameConnCode(%d) = %v, want %v", code, got, want)
		}
	}
}

// A message alone on the wire at MaxAttempts closures is not failed before
// NackGiveUp has passed since the first of them: a broker in trouble for
// a few seconds must not fail a good message.
func TestUnitBlameWaitsNackGiveUpFromFirstClosure(t *testing.T) {
	p := unitPublisher(t, Config{MaxAttempts: 2, NackGiveUp: time.Hour})
	c := unitChannel(p)
	e := unitEntry(c, nil, nil, "k")
	cerr := &amqp.Error{Code: amqp.FrameError, Reason: "FRAME_ERROR", Server: true}
	for i := 0; i < 5; i++ {
		if p.blame(suspect{c, e}, cerr) {
			t.Fatalf("resolved after %d closures within NackGiveUp", i+1)
		}
	}
	if e.resolved {
		t.Fatal("resolved within NackGiveUp")
	}
	e.firstClosure = e.firstClosure.Add(-time.Hour)
	if !p.blame(suspect{c, e}, cerr) || !e.resolved || e.res.Outcome != Returned || e.res.Code != amqp.FrameError {
		t.Fatalf("after NackGiveUp: resolved %v %+v, want returned 501", e.resolved, e.res)
	}
}

func unitSession(conn *amqp.Connection) *session {
	return &session{conn: conn, byTag: map[uint64]*entry{}, returned: map[returnKey]int{}}
}

// A message nacked a second time waits off the wire for its retry: a
// connection closed meanwhile is not counted against it, even alone.
func TestUnitNackedMessageOffTheWireIsNoSuspect(t *testing.T) {
	p := unitPublisher(t, Config{NackGiveUp: time.Hour})
	c := unitChannel(p)
	conn := &amqp.Connection{}
	s := unitSession(conn)
	e := unitEntry(c, s, conn, "k")
	e.attempts = 1 // the second nack waits in retryLater instead of a send
	e.firstNack = time.Now()
	c.confirm(s, amqp.Confirmation{DeliveryTag: e.tag, Ack: false})
	c.mu.Lock()
	if e.retry != nil {
		e.retry.Stop()
	}
	c.mu.Unlock()
	p.collectSuspects(conn, &amqp.Error{Code: amqp.FrameError, Reason: "FRAME_ERROR", Server: true})
	if e.closures != 0 || e.resolved || len(p.suspects) != 0 {
		t.Fatalf("a nacked message off the wire: %d closures, resolved %v (%+v), %d suspects; want none",
			e.closures, e.resolved, e.res, len(p.suspects))
	}
}

// The broker's ack wins over the Publisher's verdict while the Result is
// not delivered yet, and a message gets its Result once: an ack the
// Channel's goroutine handles after the probe resolved the message does
// not resolve it again.
func TestUnitAckWinsOverPublisherVerdict(t *testing.T) {
	p := unitPublisher(t, Config{})
	c := unitChannel(p)
	conn := &amqp.Connection{}
	s := unitSession(conn)
	e := unitEntry(c, s, conn, "k")
	next := unitEntry(c, nil, nil, "k") // parked behind e
	c.resolveFromPublisher(e, Returned, amqp.FrameError, "closed the connection")
	heads := c.heads
	var got []Result
	c.onResult = func(r Result) { got = append(got, r) }
	c.confirm(s, amqp.Confirmation{DeliveryTag: e.tag, Ack: true})
	if len(got) != 1 || got[0].Outcome != Confirmed || got[0].Tag != e.msg.Tag {
		t.Fatalf("results %+v, want one: confirmed", got)
	}
	if c.heads != heads || !next.head || len(c.keys["k"]) != 1 {
		t.Fatalf("resolved twice: heads %d (was %d), next head %v, key list %d", c.heads, heads, next.head, len(c.keys["k"]))
	}
}

// A message the probe saw confirmed keeps that Result when the Channel's
// goroutine then handles a nack of its earlier publish: it is neither
// published again nor resolved a second time.
func TestUnitPublisherConfirmStandsOverLateNack(t *testing.T) {
	p := unitPublisher(t, Config{})
	c := unitChannel(p)
	conn := &amqp.Connection{}
	s := unitSession(conn) // no AMQP channel: a send would panic
	e := unitEntry(c, s, conn, "k")
	c.resolveFromPublisher(e, Confirmed, 0, "")
	var got []Result
	c.onResult = func(r Result) { got = append(got, r) }
	c.confirm(s, amqp.Confirmation{DeliveryTag: e.tag, Ack: false})
	if len(got) != 1 || got[0].Outcome != Confirmed || e.attempts != 0 {
		t.Fatalf("results %+v, attempts %d; want one: confirmed, no attempt counted", got, e.attempts)
	}
}

// A message republished after a reconnect is checked against the new
// connection's frame_max (a node with a smaller one): over it, it is
// resolved Returned 311 unsent, and its key's next message takes its turn
// (here over the limit as well, so nothing is sent on the fake session).
func TestUnitRepublishChecksFrameMax(t *testing.T) {
	p := unitPublisher(t, Config{})
	c := unitChannel(p)
	conn := &amqp.Connection{Config: amqp.Config{FrameSize: 4096}}
	s := unitSession(conn) // no AMQP channel: a send would panic
	c.sess = s
	e := unitEntry(c, nil, nil, "k")
	next := unitEntry(c, nil, nil, "k")
	next.head = false
	c.heads--
	e.headerSize, next.headerSize = 5000, 4097
	c.pubMu.Lock()
	sent := c.sendLocked(s, e)
	c.pubMu.Unlock()
	if !sent {
		t.Fatal("the session was reported dead")
	}
	for i, x := range []*entry{e, next} {
		if !x.resolved || x.res.Outcome != Returned || x.res.Code != amqp.ContentTooLarge || !strings.Contains(x.res.Reason, "frame_max of 4096") {
			t.Errorf("message %d: resolved %v %+v, want returned 311 over frame_max of 4096", i, x.resolved, x.res)
		}
	}
	if c.heads != 0 || len(s.byTag) != 0 {
		t.Errorf("heads %d, %d on the wire; want 0, 0", c.heads, len(s.byTag))
	}
}
