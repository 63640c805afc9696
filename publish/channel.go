package publish

// This file holds the Channel's messages: Publish, the order per key and the
// Results. session.go holds the AMQP channel's life (republish, confirms,
// probe mode).

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/backoff"
)

// Channel publishes on its own AMQP channel with publisher confirms, in
// order per partition key, with at most ConfirmWindow messages on the wire
// and at most MaxHeldBytes held without a delivered Result. See the package
// documentation for the ordering and outcome guarantees.
//
// Publish, Flush and Close are safe for concurrent use. Results go to the
// onResult callback given to NewChannel one at a time, from one goroutine
// owned by the Channel, in publish order per key: a message's Result comes
// after the Results of every earlier message of its Message.Key, and as
// soon as it has its outcome otherwise, so a message nacked and retried
// holds back the Results of its own key only. Results of different keys,
// and of messages with Key "", come in the order of their outcomes, not in
// publish order. The callback must not call Publish, Flush or Close of
// the same Channel (they may wait for the callback to return) and should be
// quick: while it runs no other Result is delivered and no window slot frees.
type Channel struct {
	p        *Publisher
	onResult func(Result)
	window   int
	maxBytes int64
	log      *zap.Logger
	tracer   trace.Tracer // nil: no spans
	// ctx ends on Close or when the Publisher ends.
	ctx    context.Context
	cancel context.CancelFunc

	// pubMu serializes every send on the AMQP channel together with the
	// decision to send and the tag assignment before it, so that delivery
	// tags go out in the order they were assigned. Lock order: pubMu, then mu.
	pubMu sync.Mutex

	mu sync.Mutex
	// queue holds the accepted messages without a delivered Result, in
	// publish order; a message leaves it once its Result is delivered,
	// which may come before the Results of earlier messages of other keys.
	queue entryList
	// deliverable holds the resolved messages whose Results may be
	// delivered now, in the order deliver hands them over: every earlier
	// message of the same key has its Result delivered, or is ahead here.
	deliverable []*entry
	// keys holds, per non-empty partition key, its unresolved messages in
	// publish order. Only the first (the key's head) may be on the wire; the
	// others are parked until the ones before them have their Result.
	keys map[string][]*entry
	// heads counts the unresolved messages that may be on the wire: key
	// heads and messages without a key, sent or waiting for a session.
	// The window bounds it; parked messages do not count.
	heads int
	// held is the Size of the messages without a delivered Result.
	held int64
	sess *session // current AMQP channel; nil while there is none
	// waitSince is when the Channel began waiting for a confirmation:
	// the first publish with none outstanding, or the last confirmation
	// while some stay outstanding; zero while none is (ConfirmWait).
	waitSince time.Time
	// nackWarned is when a nack was last logged at WARN; confirm (the
	// Channel's goroutine) only.
	nackWarned time.Time
	ready      bool // sess takes new messages (republish or probe finished)
	probe      bool // republish the suspects one at a time to find the message that closed the channel
	nextSeq    uint64
	closed     bool
	changed    chan struct{} // closed and replaced when anything Publish or Flush wait for changes

	// kick tells the Channel's goroutine that Publish resolved a message
	// itself (missing exchange), so that it delivers the Result.
	kick chan struct{}
	done chan struct{} // closed when run returns
}

// entry is one accepted message.
type entry struct {
	seq  uint64
	msg  Message
	size int64 // what it counts in held
	// headerSize is HeaderFrameSize of msg, checked against the frame_max
	// of every connection it is sent on (sendLocked).
	headerSize int
	head       bool // it counts in heads: a key head or without a key, unresolved
	attempts   int  // publishes the broker nacked
	// firstNack is when the broker first nacked it; retry, while set, is
	// the timer that publishes it again after a nack (nackBackoff), which
	// a send for another reason (a new session) makes moot.
	firstNack   time.Time
	nackBackoff backoff.Counter
	retry       *time.Timer
	tag         uint64 // delivery tag in the current session; 0 when not outstanding
	// sentOn is the connection it is on the wire on (blame.go), nil once
	// a confirmation took it off; closures counts the connections the
	// broker closed while it alone was on the wire, the first at
	// firstClosure.
	sentOn       *amqp.Connection
	closures     int
	firstClosure time.Time
	dc           *amqp.DeferredConfirmation
	suspect      bool // unconfirmed when the broker closed the channel over one of several (probe mode)
	resolved     bool
	res          Result
	// followers are the messages of its key resolved without being sent
	// (a missing exchange, over the size limits at Publish) while it was
	// its key's last unresolved message: their Results follow its own.
	followers []*entry
	handed    bool       // its Result was taken for the callback (deliver)
	span      trace.Span // the publish span; nil when tracing is off
	// older and newer are its neighbours in the Channel's queue.
	older, newer *entry
}

// NewChannel opens a Channel. onResult receives every message's Result.
// The AMQP channel is opened in the background: Publish waits for it.
func (p *Publisher) NewChannel(onResult func(Result)) (*Channel, error) {
	if onResult == nil {
		return nil, fmt.Errorf("publish: new channel: onResult is nil")
	}
	ctx, cancel := context.WithCancel(p.ctx)
	c := &Channel{
		p:        p,
		onResult: onResult,
		window:   p.cfg.ConfirmWindow,
		maxBytes: p.cfg.MaxHeldBytes,
		tracer:   p.cfg.Tracer,
		log:      p.log,
		ctx:      ctx,
		cancel:   cancel,
		keys:     map[string][]*entry{},
		changed:  make(chan struct{}),
		kick:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	if err := p.register(c); err != nil {
		cancel()
		return nil, fmt.Errorf("publish: new channel: %w", err)
	}
	go c.run()
	return c, nil
}

// Publish sends m, or parks it while an earlier message of its Key has no
// Result yet. It waits while the window is full and m would go on the wire,
// while the messages held would exceed MaxHeldBytes with m, while the broker
// blocks the connection or there is no open AMQP channel (connection down,
// republish after a reconnect in progress), and the first time it sees m's
// exchange it waits for the broker to say whether the exchange exists. A
// message over the limits of the connection (HeaderFrameSize over its
// negotiated frame_max, a body over MaxMessageSize) is not sent: it is
// resolved Returned with Code 311 and a Reason that names the limit and the
// size, its Result after those of the earlier messages of its key, as a
// message to a missing exchange is. It returns ctx.Err() if ctx ends first,
// ErrClosed once the Channel or Publisher is closed, or a *BadRecordError
// for a message that cannot be encoded (headers of unsupported types, short
// strings over 255 bytes). Once Publish returned nil the message will get
// exactly one Result, unless Close comes first.
func (c *Channel) Publish(ctx context.Context, m Message) error {
	if err := validateMessage(&m); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	missing, err := c.p.checkExchange(ctx, c.ctx.Done(), m.Exchange)
	if err != nil {
		return err
	}
	headerSize := HeaderFrameSize(&m.Publishing)
	tooLarge, err := c.awaitRoom(ctx, &m, missing == nil, headerSize)
	if err != nil {
		return err
	}
	e, send := c.enqueueLocked(m, headerSize, missing, tooLarge)
	sess := c.sess
	c.mu.Unlock()
	// A failed send leaves e queued without a tag: the session is gone and
	// the next one republishes it.
	if send {
		c.sendLocked(sess, e)
	}
	c.pubMu.Unlock()
	return nil
}

// awaitRoom waits until the Channel takes m (see Publish) and returns with
// pubMu and mu held, and why m cannot go on the current connection
// (tooLarge, "" when it can); toWire says m's exchange exists. On an error
// it holds neither.
func (c *Channel) awaitRoom(ctx context.Context, m *Message, toWire bool, headerSize int) (tooLarge string, err error) {
	c.pubMu.Lock()
	for {
		c.mu.Lock()
		_, blocked, finished, pchanged := c.p.state()
		if c.closed || finished {
			c.mu.Unlock()
			c.pubMu.Unlock()
			return "", ErrClosed
		}
		if c.ready && !blocked {
			// The limits of the connection the message would go on: a
			// message over them would close the channel or the whole
			// connection, and come back after every reconnect.
			if !c.p.noSizeCheck {
				tooLarge = sizeRefusal(c.sess.conn, headerSize, m, c.p.cfg.MaxMessageSize)
			}
			if c.roomLocked(m, toWire && tooLarge == "") {
				return tooLarge, nil
			}
		}
		changed := c.changed
		c.mu.Unlock()
		c.pubMu.Unlock()
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-changed:
		case <-pchanged:
		}
		c.pubMu.Lock()
	}
}

// enqueueLocked accepts m: it resolves it at once when its exchange is
// missing or it is too large, else queues it behind its key, and reports
// whether it goes on the wire now (send). The caller holds pubMu and mu.
func (c *Channel) enqueueLocked(m Message, headerSize int, missing *amqp.Error, tooLarge string) (e *entry, send bool) {
	c.nextSeq++
	e = &entry{seq: c.nextSeq, msg: m, size: messageSize(&m), headerSize: headerSize}
	c.held += e.size
	if c.tracer != nil {
		e.span = c.startSpan(&e.msg)
	}
	c.queue.pushBack(e)
	switch {
	case missing != nil || tooLarge != "":
		// Never sent: it would close the channel (or, too large, the
		// connection), and the broker would drop or take the messages
		// pipelined with it unknown to us.
		if missing != nil {
			c.resolveLocked(e, Returned, missing.Code, fmt.Sprintf("exchange not found: %d %s", missing.Code, missing.Reason))
		} else {
			c.resolveLocked(e, Returned, amqp.ContentTooLarge, tooLarge)
		}
		select {
		case c.kick <- struct{}{}:
		default:
		}
	case m.Key == "":
		send = true
	default:
		c.keys[m.Key] = append(c.keys[m.Key], e)
		send = len(c.keys[m.Key]) == 1
	}
	if send {
		e.head = true
		c.heads++
	}
	return e, send
}

// roomLocked reports whether the Channel takes m now: a message that would
// go on the wire (a key head, or without a key, toWire unless it is to a
// missing exchange) needs a window slot, and any message needs MaxHeldBytes
// room, except when nothing is held (a message larger than the bound still
// passes, alone).
func (c *Channel) roomLocked(m *Message, toWire bool) bool {
	if toWire && (m.Key == "" || len(c.keys[m.Key]) == 0) && c.heads >= c.window {
		return false
	}
	return c.held == 0 || c.held+messageSize(m) <= c.maxBytes
}

// messageSize is what m counts in MaxHeldBytes: its Size, or its body and
// headers' rough size when the caller left Size 0.
func messageSize(m *Message) int64 {
	if m.Size > 0 {
		return int64(m.Size)
	}
	return int64(len(m.Publishing.Body) + len(m.Key) + 160)
}

// sendLocked publishes e on sess. The caller holds pubMu (not mu) and has
// checked that e may go on the wire (its key's head). It reports whether
// the send went out; on failure the session is dead. A message over the
// frame_max of sess's connection (a reconnect to a node with a smaller
// one) is resolved Returned instead, and what would follow its confirm
// is sent (tooLargeLocked).
func (c *Channel) sendLocked(sess *session, e *entry) bool {
	c.mu.Lock()
	if reason := c.frameRefusal(sess, e); reason != "" {
		next := c.resolveLocked(e, Returned, amqp.ContentTooLarge, reason)
		c.mu.Unlock()
		return c.tooLargeLocked(sess, next)
	}
	sess.nextTag++
	tag := sess.nextTag
	e.tag = tag
	// A DeferredConfirmation of an earlier session is settled as a nack
	// when its channel closed; it must not answer for this publish.
	e.dc = nil
	if e.retry != nil {
		e.retry.Stop()
		e.retry = nil
	}
	sess.byTag[tag] = e
	e.sentOn = sess.conn
	if c.waitSince.IsZero() {
		c.waitSince = time.Now()
	}
	c.mu.Unlock()
	m := &e.msg
	dc, err := sess.ch.PublishWithDeferredConfirm(m.Exchange, m.RoutingKey, true, false, m.Publishing)
	if err == nil {
		c.mu.Lock()
		e.dc = dc
		c.mu.Unlock()
		if dc != nil && dc.DeliveryTag != tag {
			// Only this Channel publishes on sess.ch, under pubMu.
			c.log.Error("delivery tag out of step", zap.Uint64("want", tag), zap.Uint64("got", dc.DeliveryTag))
		}
		return true
	}
	// amqp091 gave the tag back; this only happens when the channel or the
	// connection is closed, so run() sees the close and republishes e.
	c.mu.Lock()
	if sess.byTag[tag] == e {
		delete(sess.byTag, tag)
		e.tag = 0
		e.sentOn = nil
	}
	sess.nextTag--
	if c.sess == sess {
		c.ready = false
	}
	c.mu.Unlock()
	c.log.Debug("publish failed, will republish on a new channel", zap.Error(err))
	return false
}

// frameRefusal says why e cannot go on sess's connection: its
// content-header frame is over the connection's frame_max; "" when it can.
func (c *Channel) frameRefusal(sess *session, e *entry) string {
	if c.p.noSizeCheck || sess.conn == nil {
		return ""
	}
	return sizeRefusal(sess.conn, e.headerSize, &Message{}, 0)
}

// tooLargeLocked goes on after sendLocked resolved a message without
// sending it: it delivers the Result, and sends what its confirm would
// have led to (the next suspect in probe mode, else its key's next
// message next). The caller holds pubMu.
func (c *Channel) tooLargeLocked(sess *session, next *entry) bool {
	select {
	case c.kick <- struct{}{}:
	default:
	}
	c.mu.Lock()
	if c.sess != sess {
		c.mu.Unlock()
		return true
	}
	if c.probe {
		if first := c.firstSuspectLocked(); first != nil {
			c.mu.Unlock()
			return c.sendLocked(sess, first)
		}
		c.endProbeLocked()
		pending := c.unsentLocked()
		c.mu.Unlock()
		c.sendAllLocked(sess, pending)
		return true
	}
	ok := next != nil && !next.resolved && next.tag == 0 && c.headLocked(next)
	c.mu.Unlock()
	if ok {
		return c.sendLocked(sess, next)
	}
	return true
}

// Flush waits until every message whose Publish returned before Flush was
// called has its Result delivered (the callback returned), or ctx ends.
func (c *Channel) Flush(ctx context.Context) error {
	c.mu.Lock()
	target := c.nextSeq
	c.mu.Unlock()
	for {
		c.mu.Lock()
		// The queue holds, oldest first, the messages still without a
		// delivered Result: Flush is done once none of them is older than
		// target, whatever the order the Results came in.
		oldest, closed, changed := c.queue.front, c.closed, c.changed
		done := oldest == nil || oldest.seq > target
		c.mu.Unlock()
		if done {
			return nil
		}
		if closed {
			return ErrClosed
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Close closes the AMQP channel and stops the Channel's goroutine, waiting
// for a callback in progress. Messages without a Result by then get none.
// Idempotent.
func (c *Channel) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		c.notifyLocked()
	}
	for e := range c.queue.all() {
		if e.retry != nil {
			e.retry.Stop()
			e.retry = nil
		}
	}
	c.mu.Unlock()
	c.cancel()
	<-c.done
	c.endOpenSpans()
	return nil
}

// endOpenSpans ends the publish spans of the messages left without a
// Result by Close, so that they are exported (status error) rather than
// lost. Only Close calls it, after run returned.
func (c *Channel) endOpenSpans() {
	if c.tracer == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for e := range c.queue.all() {
		if e.span != nil {
			e.span.SetStatus(codes.Error, "no outcome: the channel was closed first")
			e.span.End()
			e.span = nil
		}
	}
}

func (c *Channel) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// resolveLocked records e's Result and makes it deliverable after the
// Results of the earlier messages of its key (queueResultLocked). It frees
// e's key and returns the key's next message, now its head, which the
// caller sends when the session takes messages (nil when there is none).
func (c *Channel) resolveLocked(e *entry, o Outcome, code int, reason string) (next *entry) {
	e.resolved = true
	e.res = Result{Tag: e.msg.Tag, Outcome: o, Code: code, Reason: reason}
	k := e.msg.Key
	// Only a key's head is ever sent, so only a head gets resolved, except
	// a message resolved unsent at Publish (a missing exchange, too
	// large), which never joined its key.
	list := c.keys[k]
	isHead := k != "" && len(list) > 0 && list[0] == e
	c.queueResultLocked(e, isHead)
	if isHead {
		list[0] = nil
		if list = list[1:]; len(list) == 0 {
			delete(c.keys, k)
		} else {
			c.keys[k] = list
			next = list[0]
		}
	}
	if e.head {
		e.head = false
		if next != nil {
			next.head = true // takes e's window slot
		} else if c.heads--; c.heads == c.window-1 {
			c.notifyLocked() // a Publish may wait for the slot
		}
	}
	return next
}

// queueResultLocked makes the Result of e, just resolved, deliverable once
// the Results of the earlier messages of its key are delivered or
// deliverable: at once for a message without a key, for its key's head
// (every earlier message of the key has its Result, and its followers come
// right after it) and for a message resolved unsent while its key has no
// unresolved message; otherwise (resolved unsent behind unresolved
// messages of its key) as a follower of the key's last unresolved message.
func (c *Channel) queueResultLocked(e *entry, isHead bool) {
	list := c.keys[e.msg.Key]
	if e.msg.Key != "" && !isHead && len(list) > 0 {
		last := list[len(list)-1]
		last.followers = append(last.followers, e)
		return
	}
	c.deliverable = append(c.deliverable, e)
	c.deliverable = append(c.deliverable, e.followers...)
	e.followers = nil
}

// headLocked reports whether e may go on the wire: it has no key, or every
// earlier message of its key has its Result.
func (c *Channel) headLocked(e *entry) bool {
	if e.msg.Key == "" {
		return true
	}
	list := c.keys[e.msg.Key]
	return len(list) > 0 && list[0] == e
}

// unsentLocked returns the unresolved key heads that are not outstanding on
// the current session, in publish order: what a session republishes.
func (c *Channel) unsentLocked() []*entry {
	var out []*entry
	for e := range c.queue.all() {
		if !e.resolved && e.tag == 0 && c.headLocked(e) {
			out = append(out, e)
		}
	}
	return out
}

// deliver calls onResult for the deliverable messages (queueResultLocked),
// in the order they became so. Only run's goroutine calls it, so Results
// never overlap, and a key's Results never reorder. The entry counts in
// MaxHeldBytes until the callback returned, so that bound covers
// everything the Channel holds.
func (c *Channel) deliver() {
	for {
		c.mu.Lock()
		if len(c.deliverable) == 0 {
			c.mu.Unlock()
			return
		}
		e := c.deliverable[0]
		c.deliverable[0] = nil
		c.deliverable = c.deliverable[1:]
		e.handed = true
		c.mu.Unlock()
		if e.span != nil {
			endSpan(e.span, e.res)
		}
		c.onResult(e.res)
		c.mu.Lock()
		c.queue.remove(e)
		c.held -= e.size
		c.notifyLocked()
		c.mu.Unlock()
	}
}
