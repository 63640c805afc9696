package publish

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/backoff"
)

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
		c.cancel()
	}()
	bo := backoff.Counter{Min: c.p.cfg.ReconnectMin, Max: c.p.cfg.ReconnectMax}
	for {
		conn := c.p.awaitConn(c.ctx.Done())
		if conn == nil {
			return
		}
		sess, err := c.open(conn)
		if err != nil {
			if !conn.IsClosed() {
				c.log.Warn("open AMQP channel", zap.Error(err))
			}
			if !backoff.Sleep(c.ctx, bo.Next()) {
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
		} else if !backoff.Sleep(c.ctx, bo.Next()) {
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
	c.deliver()
	for {
		select {
		case <-c.ctx.Done():
			// When the Publisher ends it closes the connection, which takes
			// the channel down. A blocked broker does not read from the
			// socket, so it would never answer channel.close; the
			// connection's close (bounded) takes the channel down then.
			if c.p.ctx.Err() == nil && !c.p.Blocked() {
				_ = s.ch.Close()
			}
			return false, true
		case <-c.kick:
			c.deliver()
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

// start makes s current and republishes the unresolved head of every key
// (and every unresolved message without a key) in publish order, all at
// once, or in probe mode only the first suspect. Parked messages follow as
// their keys free up.
func (c *Channel) start(s *session) {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	c.mu.Lock()
	c.sess = s
	first := c.firstSuspectLocked()
	if first == nil {
		c.endProbeLocked()
	}
	probe := c.probe
	pending := c.unsentLocked()
	c.mu.Unlock()
	if probe {
		c.log.Info("probing unconfirmed messages one at a time after a channel exception")
		c.sendLocked(s, first)
		return
	}
	c.sendAllLocked(s, pending)
}

// sendAllLocked sends pending in order on s, then lets Publish send on s.
// The caller holds pubMu.
func (c *Channel) sendAllLocked(s *session, pending []*entry) {
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
	c.drainReturns(s)
	c.mu.Lock()
	e := c.takeTagLocked(s, conf.DeliveryTag)
	if e == nil {
		c.mu.Unlock()
		c.log.Warn("confirmation for an unknown delivery tag", zap.Uint64("tag", conf.DeliveryTag))
		return
	}
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
	returned := c.takeReturnLocked(s, e)
	retry := false
	var next *entry
	switch {
	case e.resolved:
		// The Publisher's probe resolved it meanwhile (blame.go).
		c.settleResolvedLocked(e, ack && !returned)
	case returned:
		next = c.resolveLocked(e, Returned, 312, "312 NO_ROUTE")
	case ack:
		next = c.resolveLocked(e, Confirmed, 0, "")
	default:
		retry, next = c.nackLocked(e)
	}
	probe := c.probe
	c.mu.Unlock()

	switch {
	case retry:
		c.retryNacked(s, e)
	case probe:
		c.probeNext(s)
	case next != nil:
		c.sendNext(s, next)
	}
	c.deliver()
}

// drainReturns records the basic.returns amqp091 queued. A basic.return
// precedes the ack of its publish and amqp091 queued it before queueing
// the ack, so confirm takes them first.
func (c *Channel) drainReturns(s *session) {
	for {
		select {
		case r, ok := <-s.returns:
			if !ok {
				s.returns = nil
				return
			}
			c.recordReturn(s, r)
		default:
			return
		}
	}
}

// takeTagLocked takes the entry of tag off the wire of s (nil when it is
// unknown): no delivery tag, no longer on s's connection. The caller holds
// mu; takeTagLocked may release it for a moment.
func (c *Channel) takeTagLocked(s *session, tag uint64) *entry {
	e := s.byTag[tag]
	if e != nil && e.dc == nil {
		// The confirmation overtook the return of the publish call that
		// sets e.dc; that call holds pubMu until it has.
		c.mu.Unlock()
		c.pubMu.Lock()
		c.pubMu.Unlock()
		c.mu.Lock()
		e = s.byTag[tag]
	}
	if e == nil {
		return nil
	}
	delete(s.byTag, tag)
	e.tag = 0
	// Off the wire: a connection closed from now on is not its doing
	// (collectSuspects), even while it waits for a retry after a nack.
	e.sentOn = nil
	if len(s.byTag) == 0 {
		c.waitSince = time.Time{}
	} else {
		c.waitSince = time.Now()
	}
	return e
}

// takeReturnLocked reports whether the broker returned e on s (a
// basic.return with its message id, exchange and routing key), and takes
// that return.
func (c *Channel) takeReturnLocked(s *session, e *entry) bool {
	key := returnKey{e.msg.Publishing.MessageId, e.msg.Exchange, e.msg.RoutingKey}
	if s.returned[key] == 0 {
		return false
	}
	if s.returned[key]--; s.returned[key] == 0 {
		delete(s.returned, key)
	}
	return true
}

// settleResolvedLocked handles the confirmation of a message the
// Publisher's probe resolved already: a message gets one Result, and one
// the broker acked is Confirmed, never failed, as long as its Result is not
// delivered (the probe only fails a message without an ack, see
// Publisher.blame, so a delivered one was right).
func (c *Channel) settleResolvedLocked(e *entry, acked bool) {
	if !acked || e.res.Outcome == Confirmed || e.handed {
		return
	}
	c.log.Warn("the broker acked a message the search for the message that closed the connection had given up; reporting it as confirmed",
		zap.String("message_id", e.msg.Publishing.MessageId), zap.String("was", e.res.Reason))
	e.res = Result{Tag: e.msg.Tag, Outcome: Confirmed}
}

// nackLocked counts a nack of e and resolves it Rejected once the broker
// nacked it MaxAttempts times over NackGiveUp at least (next is then its
// key's next message); otherwise retry says to publish it again.
func (c *Channel) nackLocked(e *entry) (retry bool, next *entry) {
	e.attempts++
	if e.attempts == 1 {
		e.firstNack = time.Now()
		e.nackBackoff = backoff.Counter{Min: c.p.cfg.ReconnectMin, Max: c.p.cfg.ReconnectMax}
	}
	if e.attempts >= c.p.cfg.MaxAttempts && time.Since(e.firstNack) >= c.p.cfg.NackGiveUp {
		return false, c.resolveLocked(e, Rejected, 0, fmt.Sprintf("nacked %d times over %v", e.attempts, time.Since(e.firstNack).Round(time.Millisecond)))
	}
	return true, nil
}

// retryNacked publishes e, just nacked, again: at once the first time,
// after its backoff later. Still its key's head: the messages of its key
// after it stay parked, so it is published again ahead of them.
func (c *Channel) retryNacked(s *session, e *entry) {
	// A quorum queue electing a leader nacks a whole window at once:
	// one WARN a second per Channel says so, the rest go to DEBUG.
	log := c.log.Debug
	if now := time.Now(); e.attempts == 1 && now.Sub(c.nackWarned) >= time.Second {
		log, c.nackWarned = c.log.Warn, now
	}
	log("broker nacked a message, publishing it again (more nacks within a second are logged at DEBUG)",
		zap.String("message_id", e.msg.Publishing.MessageId), zap.Int("attempt", e.attempts+1))
	if e.attempts == 1 {
		c.pubMu.Lock()
		c.sendLocked(s, e)
		c.pubMu.Unlock()
	} else {
		c.retryLater(s, e)
	}
}

// retryLater publishes e, nacked more than once, again on s after its
// backoff: a broker that nacks everything for a while (a quorum queue
// electing a leader) is not flooded, and e's attempts are spread over
// time. e stays its key's head meanwhile. When s ends first, the next
// session's republish sends e (its tag is 0) and stops the timer.
func (c *Channel) retryLater(s *session, e *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.retry != nil {
		e.retry.Stop()
	}
	var tm *time.Timer
	tm = time.AfterFunc(e.nackBackoff.Next(), func() {
		c.pubMu.Lock()
		defer c.pubMu.Unlock()
		c.mu.Lock()
		ok := e.retry == tm && !c.closed && c.sess == s && c.ready && !e.resolved && e.tag == 0
		if e.retry == tm {
			e.retry = nil
		}
		c.mu.Unlock()
		if ok {
			c.sendLocked(s, e)
		}
	})
	e.retry = tm
}

// sendNext sends e, which just became its key's head, when s is current and
// takes messages; otherwise the next republish (start, or the end of probe
// mode) sends it.
func (c *Channel) sendNext(s *session, e *entry) {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	c.mu.Lock()
	ok := c.sess == s && c.ready && !e.resolved && e.tag == 0 && c.headLocked(e)
	c.mu.Unlock()
	if ok {
		c.sendLocked(s, e)
	}
}

// firstSuspectLocked is the first unresolved suspect in publish order.
func (c *Channel) firstSuspectLocked() *entry {
	if !c.probe {
		return nil
	}
	for e := range c.queue.all() {
		if e.suspect && !e.resolved {
			return e
		}
	}
	return nil
}

func (c *Channel) endProbeLocked() {
	c.probe = false
	for e := range c.queue.all() {
		e.suspect = false
	}
}

// probeNext publishes the next suspect, or leaves probe mode when none is
// left: then every unsent key head goes out at once and Publish resumes.
func (c *Channel) probeNext(s *session) {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	c.mu.Lock()
	if c.sess != s {
		c.mu.Unlock()
		return
	}
	next := c.firstSuspectLocked()
	if next == nil {
		c.endProbeLocked()
		pending := c.unsentLocked()
		c.mu.Unlock()
		c.sendAllLocked(s, pending)
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
		e.tag = 0
		if !e.resolved { // the Publisher's probe may have resolved it
			outstanding = append(outstanding, e)
		}
	}
	clear(s.byTag)
	c.waitSince = time.Time{} // republished on the next session
	if c.sess == s {
		c.sess = nil
		c.ready = false
	}
	// amqp091 marks the connection closed before it closes its channels,
	// so a channel closed by a connection loss always sees it here.
	channelException := cerr != nil && cerr.Server && !s.conn.IsClosed()
	if channelException && cerr.Code == amqp.NotFound {
		// An exchange checked earlier is gone: check again before the next
		// message to any of these exchanges is accepted.
		for _, e := range outstanding {
			c.p.forgetExchange(e.msg.Exchange)
		}
	}
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
		// Its key's next message goes out with the next session.
		c.resolveLocked(e, Returned, cerr.Code, reason)
		c.endProbeLocked()
		progress = true
		c.log.Warn("broker closed the channel over a message; reported it as returned",
			zap.String("message_id", e.msg.Publishing.MessageId),
			zap.String("exchange", e.msg.Exchange), zap.String("reason", reason))
	case len(outstanding) > 1:
		c.endProbeLocked()
		c.probe = true
		for _, e := range outstanding {
			e.suspect = true
		}
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
