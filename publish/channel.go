package publish

import (
	"context"
	"fmt"
	"github.com/outbox-relay/outbox-relay/internal/backoff"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// Channel publishes in order on its own AMQP channel with publisher confirms,
// holding at most ConfirmWindow messages without a Result. See the package
// documentation for the ordering and outcome guarantees.
//
// Publish, Flush and Close are safe for concurrent use. Results go to the
// onResult callback given to NewChannel, in publish order, from one goroutine
// owned by the Channel; the callback must not call Publish, Flush or Close of
// the same Channel (they may wait for the callback to return) and should be
// quick: while it runs no other Result is delivered and no window slot frees.
type Channel struct {
	p        *Publisher
	onResult func(Result)
	window   int
	log      *zap.Logger

	// pubMu serializes every send on the AMQP channel together with the
	// queue append or tag assignment before it, so that the order on the
	// wire is the order of queue. Lock order: pubMu, then mu.
	pubMu sync.Mutex

	mu        sync.Mutex
	queue     []*entry // accepted messages without a delivered Result, in publish order
	sess      *session // current AMQP channel; nil while there is none
	ready     bool     // sess takes new messages (republish or probe finished)
	probe     bool     // republish one at a time to find the message that closed the channel
	nextSeq   uint64
	delivered uint64 // seq of the last message whose Result was delivered
	closed    bool
	changed   chan struct{} // closed and replaced when anything Publish or Flush wait for changes

	closing chan struct{} // closed by Close
	done    chan struct{} // closed when run returns
}

// entry is one accepted message.
type entry struct {
	seq      uint64
	msg      Message
	attempts int    // publishes the broker nacked
	tag      uint64 // delivery tag in the current session; 0 when not outstanding
	dc       *amqp.DeferredConfirmation
	resolved bool
	res      Result
}

// session is one AMQP channel in confirm mode. Its notification channels
// are buffered to the window: at most window delivery tags are outstanding
// (each entry has at most one), so amqp091's reader never waits on them —
// it would drop a notification after 5s.
type session struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closes   chan *amqp.Error
	nextTag  uint64
	byTag    map[uint64]*entry
	returned map[returnKey]int // basic.returns not yet matched with their confirmation
}

type returnKey struct{ messageID, exchange, routingKey string }

// NewChannel opens a Channel. onResult receives every message's Result.
// The AMQP channel is opened in the background: Publish waits for it.
func (p *Publisher) NewChannel(onResult func(Result)) (*Channel, error) {
	if onResult == nil {
		return nil, fmt.Errorf("publish: new channel: onResult is nil")
	}
	c := &Channel{
		p:        p,
		onResult: onResult,
		window:   p.cfg.ConfirmWindow,
		log:      p.log,
		changed:  make(chan struct{}),
		closing:  make(chan struct{}),
		done:     make(chan struct{}),
	}
	if err := p.register(c); err != nil {
		return nil, fmt.Errorf("publish: new channel: %w", err)
	}
	go c.run()
	return c, nil
}

// Publish sends m. It waits while the window is full, the broker blocks the
// connection or there is no open AMQP channel (connection down, republish
// after a reconnect in progress), and returns ctx.Err() if ctx ends first,
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
	c.pubMu.Lock()
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			c.pubMu.Unlock()
			return ErrClosed
		}
		_, blocked, finished, pchanged := c.p.state()
		if finished {
			c.mu.Unlock()
			c.pubMu.Unlock()
			return ErrClosed
		}
		if c.ready && !blocked && len(c.queue) < c.window {
			break
		}
		changed := c.changed
		c.mu.Unlock()
		c.pubMu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-pchanged:
		}
		c.pubMu.Lock()
	}
	c.nextSeq++
	e := &entry{seq: c.nextSeq, msg: m}
	c.queue = append(c.queue, e)
	sess := c.sess
	c.mu.Unlock()
	// A failed send leaves e queued without a tag: the session is gone and
	// the next one republishes it.
	c.sendLocked(sess, e)
	c.pubMu.Unlock()
	return nil
}

// sendLocked publishes e on sess. The caller holds pubMu (not mu). It
// reports whether the send went out; on failure the session is dead.
func (c *Channel) sendLocked(sess *session, e *entry) bool {
	c.mu.Lock()
	sess.nextTag++
	tag := sess.nextTag
	e.tag = tag
	// A DeferredConfirmation of an earlier session is settled as a nack
	// when its channel closed; it must not answer for this publish.
	e.dc = nil
	sess.byTag[tag] = e
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
	}
	sess.nextTag--
	if c.sess == sess {
		c.ready = false
	}
	c.mu.Unlock()
	c.log.Debug("publish failed, will republish on a new channel", zap.Error(err))
	return false
}

// Flush waits until every message whose Publish returned before Flush was
// called has its Result delivered (the callback returned), or ctx ends.
func (c *Channel) Flush(ctx context.Context) error {
	c.mu.Lock()
	target := c.nextSeq
	c.mu.Unlock()
	for {
		c.mu.Lock()
		delivered, closed, changed := c.delivered, c.closed, c.changed
		c.mu.Unlock()
		if delivered >= target {
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
		close(c.closing)
		c.notifyLocked()
	}
	c.mu.Unlock()
	<-c.done
	return nil
}

func (c *Channel) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// run owns the Channel: it opens an AMQP channel on every connection,
// republishes, takes confirmations and returns, and delivers Results.
func (c *Channel) run() {
	defer close(c.done)
	defer c.p.unregister(c)
	defer func() {
		c.mu.Lock()
		c.closed = true
		c.ready = false
		c.notifyLocked()
		c.mu.Unlock()
	}()
	bo := backoff.Counter{Min: c.p.cfg.ReconnectMin, Max: c.p.cfg.ReconnectMax}
	for {
		conn := c.p.awaitConn(c.closing)
		if conn == nil {
			return
		}
		sess, err := c.open(conn)
		if err != nil {
			if !conn.IsClosed() {
				c.log.Warn("open AMQP channel", zap.Error(err))
			}
			if !sleep(bo.Next(), c.closing) {
				return
			}
			continue
		}
		progress, stop := c.serve(sess)
		if stop {
			return
		}
		if progress {
			bo.Reset()
		} else if !sleep(bo.Next(), c.closing) {
			return
		}
	}
}

func (c *Channel) open(conn *amqp.Connection) (*session, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	s := &session{
		conn:     conn,
		ch:       ch,
		closes:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, c.window)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, c.window)),
		byTag:    map[uint64]*entry{},
		returned: map[returnKey]int{},
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	return s, nil
}

// serve runs one session until its AMQP channel closes (stop false) or the
// Channel is closed (stop true). progress says whether the session ended in
// a way that does not call for backoff before the next one.
func (c *Channel) serve(s *session) (progress, stop bool) {
	c.start(s)
	for {
		select {
		case <-c.closing:
			// A blocked broker does not read from the socket, so it would
			// never answer channel.close; the connection's close (bounded)
			// takes the channel down then.
			if !c.p.Blocked() {
				_ = s.ch.Close()
			}
			return false, true
		case r, ok := <-s.returns:
			if !ok {
				s.returns = nil
				continue
			}
			c.recordReturn(s, r)
		case conf, ok := <-s.confirms:
			if !ok {
				return c.end(s, <-s.closes), false
			}
			c.confirm(s, conf)
		case err := <-s.closes:
			// Confirmations amqp091 queued before the close still count;
			// it closes s.confirms right after notifying the close.
			for conf := range s.confirms {
				c.confirm(s, conf)
			}
			return c.end(s, err), false
		}
	}
}

// start makes s current and republishes every message without a Result in
// its original order, all at once, or in probe mode only the first one.
func (c *Channel) start(s *session) {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	c.mu.Lock()
	c.sess = s
	var pending []*entry
	for _, e := range c.queue {
		if !e.resolved {
			pending = append(pending, e)
		}
	}
	if len(pending) == 0 {
		c.probe = false
	}
	probe := c.probe
	c.mu.Unlock()
	if probe {
		c.log.Info("probing unconfirmed messages one at a time after a channel exception",
			zap.Int("messages", len(pending)))
		c.sendLocked(s, pending[0])
		return
	}
	for _, e := range pending {
		if !c.sendLocked(s, e) {
			return
		}
	}
	c.mu.Lock()
	if c.sess == s {
		c.ready = true
		c.notifyLocked()
	}
	c.mu.Unlock()
}

func (c *Channel) recordReturn(s *session, r amqp.Return) {
	c.mu.Lock()
	s.returned[returnKey{r.MessageId, r.Exchange, r.RoutingKey}]++
	c.mu.Unlock()
}

// confirm handles one confirmation, delivered by amqp091 in tag order.
func (c *Channel) confirm(s *session, conf amqp.Confirmation) {
	// A basic.return precedes the ack of its publish and amqp091 queued it
	// before queueing the ack, so it is in s.returns now: take it first.
	for drained := false; !drained; {
		select {
		case r, ok := <-s.returns:
			if !ok {
				s.returns = nil
				drained = true
				continue
			}
			c.recordReturn(s, r)
		default:
			drained = true
		}
	}
	c.mu.Lock()
	e := s.byTag[conf.DeliveryTag]
	if e != nil && e.dc == nil {
		// The confirmation overtook the return of the publish call that
		// sets e.dc; that call holds pubMu until it has.
		c.mu.Unlock()
		c.pubMu.Lock()
		c.pubMu.Unlock()
		c.mu.Lock()
		e = s.byTag[conf.DeliveryTag]
	}
	if e == nil {
		c.mu.Unlock()
		c.log.Warn("confirmation for an unknown delivery tag", zap.Uint64("tag", conf.DeliveryTag))
		return
	}
	delete(s.byTag, conf.DeliveryTag)
	e.tag = 0
	// amqp091's resequenced stream turns an early nack into an ack when a
	// later ack with multiple=true covers its tag (it does not remember the
	// nack, so a message the broker refused would be reported Confirmed).
	// The DeferredConfirmation keeps the first disposition per tag and is
	// settled before the resequenced confirmation is sent, so it is the
	// truth whenever it is done.
	ack := conf.Ack
	if e.dc != nil {
		select {
		case <-e.dc.Done():
			ack = e.dc.Acked()
		default:
		}
		e.dc = nil
	}
	key := returnKey{e.msg.Publishing.MessageId, e.msg.Exchange, e.msg.RoutingKey}
	retry := false
	switch {
	case s.returned[key] > 0:
		if s.returned[key]--; s.returned[key] == 0 {
			delete(s.returned, key)
		}
		c.resolveLocked(e, Returned, 312, "312 NO_ROUTE")
	case ack:
		c.resolveLocked(e, Confirmed, 0, "")
	default:
		e.attempts++
		if e.attempts >= c.p.cfg.MaxAttempts {
			c.resolveLocked(e, Rejected, 0, fmt.Sprintf("nacked %d times", e.attempts))
		} else {
			retry = true
		}
	}
	probe := c.probe
	c.mu.Unlock()

	if retry {
		c.log.Warn("broker nacked a message, publishing it again",
			zap.String("message_id", e.msg.Publishing.MessageId), zap.Int("attempt", e.attempts+1))
		c.pubMu.Lock()
		c.sendLocked(s, e)
		c.pubMu.Unlock()
	} else if probe {
		c.probeNext(s)
	}
	c.deliver()
}

// probeNext publishes the next message without a Result, or leaves probe
// mode when there is none left to probe.
func (c *Channel) probeNext(s *session) {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	c.mu.Lock()
	var next *entry
	for _, e := range c.queue {
		if !e.resolved {
			next = e
			break
		}
	}
	if next == nil || c.sess != s {
		if c.sess == s {
			c.probe = false
			c.ready = true
			c.notifyLocked()
		}
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.sendLocked(s, next)
}

// blameCode reports whether a channel exception is one a basic.publish can
// cause: the message's fault, which republishing it would only repeat.
func blameCode(code int) bool {
	switch code {
	case amqp.ContentTooLarge, amqp.AccessRefused, amqp.NotFound, amqp.PreconditionFailed:
		return true
	}
	return false
}

// end retires session s after its AMQP channel closed with cerr (nil when
// closed without an error). Unconfirmed messages stay queued for the next
// session. When the broker closed the channel over a message, that message
// is resolved Returned if it can be identified, else probe mode starts.
func (c *Channel) end(s *session, cerr *amqp.Error) (progress bool) {
	c.mu.Lock()
	var outstanding []*entry
	for _, e := range s.byTag {
		outstanding = append(outstanding, e)
		e.tag = 0
	}
	clear(s.byTag)
	if c.sess == s {
		c.sess = nil
		c.ready = false
	}
	// amqp091 marks the connection closed before it closes its channels,
	// so a channel closed by a connection loss always sees it here.
	channelException := cerr != nil && cerr.Server && !s.conn.IsClosed()
	switch {
	case !channelException || !blameCode(cerr.Code):
		// A lost connection or a close no message caused: republish all.
		progress = cerr == nil || !channelException
	case len(outstanding) == 1:
		e := outstanding[0]
		reason := fmt.Sprintf("%d %s", cerr.Code, cerr.Reason)
		if cerr.Code == amqp.NotFound {
			reason = "exchange not found: " + reason
		}
		c.resolveLocked(e, Returned, cerr.Code, reason)
		c.probe = false
		progress = true
		c.log.Warn("broker closed the channel over a message; reported it as returned",
			zap.String("message_id", e.msg.Publishing.MessageId),
			zap.String("exchange", e.msg.Exchange), zap.String("reason", reason))
	case len(outstanding) > 1:
		c.probe = true
		progress = true
		c.log.Warn("broker closed the channel over one of several unconfirmed messages",
			zap.Int("unconfirmed", len(outstanding)), zap.Error(cerr))
	default:
		c.log.Warn("broker closed the channel", zap.Error(cerr))
	}
	c.notifyLocked()
	c.mu.Unlock()
	c.deliver()
	return progress
}

// resolveLocked records e's Result; deliver hands it to the callback once
// every earlier message has its Result.
func (c *Channel) resolveLocked(e *entry, o Outcome, code int, reason string) {
	e.resolved = true
	e.res = Result{Tag: e.msg.Tag, Outcome: o, Code: code, Reason: reason}
}

// deliver calls onResult for the resolved messages at the head of the queue.
// Only run's goroutine calls it, so Results never overlap or reorder. The
// entry keeps its window slot until the callback returned, so the window
// bounds everything the Channel holds.
func (c *Channel) deliver() {
	for {
		c.mu.Lock()
		if len(c.queue) == 0 || !c.queue[0].resolved {
			c.mu.Unlock()
			return
		}
		e := c.queue[0]
		c.mu.Unlock()
		c.onResult(e.res)
		c.mu.Lock()
		c.queue[0] = nil
		c.queue = c.queue[1:]
		c.delivered = e.seq
		c.notifyLocked()
		c.mu.Unlock()
	}
}
