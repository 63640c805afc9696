package publish

// This file finds the message over which the broker closed the whole
// connection (see "Messages that close the connection" in the package
// documentation). The supervisor goroutine owns Publisher.suspects; the
// entries are read and resolved under their Channel's mu.

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// suspect is a message that was on the wire (sent, unconfirmed) when the
// broker closed the connection over one message.
type suspect struct {
	c *Channel
	e *entry
}

// blameConnCode reports whether a connection.close the broker sent with
// code can be the fault of one message's own frames. RabbitMQ's reader
// (rabbit_reader) closes with 501 FRAME_ERROR over a frame past frame_max
// or with a bad end marker, 505 UNEXPECTED_FRAME over a frame out of
// place, and 502 SYNTAX_ERROR over one it cannot parse. Every other code
// is the broker's or the session's: 541 INTERNAL_ERROR comes from any
// channel process that crashed (a queue or metadata timeout while a node
// fails), 320 from an operator or a node stopping, 530 and 403 from a
// refusal of the user or vhost; counting them would fail good messages.
func blameConnCode(code int) bool {
	switch code {
	case amqp.FrameError, amqp.SyntaxError, amqp.UnexpectedFrame:
		return true
	}
	return false
}

// collectSuspects records, after the broker closed conn with cerr (a code
// blameConnCode accepts), the messages that may have been on the wire on
// conn: sent there and not taken off by a confirmation, whether handled by
// their Channel (sentOn) or only read by amqp091 (an acked
// DeferredConfirmation). The next connection publishes them one at a time
// (probe) before the Channels get it. When one alone qualifies this closure
// counts for it (blame), unless its publish call had not returned yet, whose
// outcome is not known: the probe sends it again then. Supervisor only.
func (p *Publisher) collectSuspects(conn *amqp.Connection, cerr *amqp.Error) {
	p.mu.Lock()
	chans := make([]*Channel, 0, len(p.channels))
	for c := range p.channels {
		chans = append(chans, c)
	}
	p.mu.Unlock()
	var found []suspect
	unsure := false
	for _, c := range chans {
		c.mu.Lock()
		for e := range c.queue.all() {
			if !e.resolved && e.sentOn == conn && !ackedLocked(e) {
				found = append(found, suspect{c, e})
				unsure = unsure || e.dc == nil
			}
		}
		c.mu.Unlock()
	}
	if len(found) == 1 && !unsure && p.blame(found[0], cerr) {
		found = nil
	}
	p.suspects = found
	if len(found) > 1 {
		p.log.Warn("the broker closed the connection over one of the messages on the wire; they will be published again one at a time to find it",
			zap.Int("messages", len(found)), zap.Error(cerr))
	}
}

// ackedLocked reports whether the broker acked e's last publish on its
// Channel, which amqp091 has read even if the Channel's goroutine has not
// handled it yet: such a message is confirmed, never blamed. The caller
// holds e's Channel's mu.
func ackedLocked(e *entry) bool {
	if e.dc == nil {
		return false
	}
	select {
	case <-e.dc.Done():
		return e.dc.Acked()
	default:
		return false
	}
}

// blame counts one connection the broker closed with cerr while s alone
// was on the wire, and resolves s Returned once that happened MaxAttempts
// times and NackGiveUp has passed since the first time (as for nacks: a
// broker in trouble for a few seconds must not fail a good message); it
// reports whether s is resolved (by this or earlier).
func (p *Publisher) blame(s suspect, cerr *amqp.Error) bool {
	s.c.mu.Lock()
	if s.e.resolved {
		s.c.mu.Unlock()
		return true
	}
	if ackedLocked(s.e) {
		// Acked on its Channel: its goroutine resolves it Confirmed.
		s.c.mu.Unlock()
		return false
	}
	s.e.closures++
	if s.e.closures == 1 {
		s.e.firstClosure = time.Now()
	}
	n, since := s.e.closures, time.Since(s.e.firstClosure)
	s.c.mu.Unlock()
	if n < p.cfg.MaxAttempts || since < p.cfg.NackGiveUp {
		return false
	}
	m := &s.e.msg
	reason := fmt.Sprintf("the broker closed the connection %d times over %v while this message alone was on the wire: %d %s",
		n, since.Round(time.Millisecond), cerr.Code, cerr.Reason)
	p.log.Warn("a message closed the AMQP connection every time it was published; reporting it as returned",
		zap.String("message_id", m.Publishing.MessageId), zap.String("exchange", m.Exchange),
		zap.String("routing_key", m.RoutingKey), zap.Int("closures", n), zap.Error(cerr))
	s.c.resolveFromPublisher(s.e, Returned, cerr.Code, reason)
	return true
}

// resolveFromPublisher resolves e, unless it already is, for the
// Publisher's probe; the Channel's goroutine delivers the Result (in
// publish order per key), and the next session sends its key's next
// message.
func (c *Channel) resolveFromPublisher(e *entry, o Outcome, code int, reason string) {
	c.mu.Lock()
	if !e.resolved {
		c.resolveLocked(e, o, code, reason)
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// probeOutcome is what one probe publish came to.
type probeOutcome int

const (
	probeConfirmed  probeOutcome = iota
	probeReturned                // basic.return: unroutable
	probeCleared                 // nacked, or its channel closed: not the culprit; its Channel publishes it again
	probeConnClosed              // the connection closed meanwhile
	probeStopped                 // the Publisher is closing
	probeTimedOut                // no confirm within NackGiveUp: the broker is not confirming
)

// minProbeWait is the least time the probe waits for a suspect's confirm
// (NackGiveUp when longer): a confirm takes milliseconds from a healthy
// broker, and a NackGiveUp set very short must not end every probe.
const minProbeWait = 5 * time.Second

// connEvents are a connection's notifications, registered as soon as it is
// dialled so that the probe and watch miss none.
type connEvents struct {
	closes chan *amqp.Error
	// blocks: amqp091 gives up on a listener that does not take a
	// notification within 5s; the supervisor always takes them at once.
	blocks chan amqp.Blocking
}

func notifyConn(conn *amqp.Connection) connEvents {
	return connEvents{
		closes: conn.NotifyClose(make(chan *amqp.Error, 1)),
		blocks: conn.NotifyBlocked(make(chan amqp.Blocking, 8)),
	}
}

// probe publishes the suspects on conn one at a time, each waiting for its
// outcome, before conn is handed to the Channels: a confirmed or returned
// message is resolved so, a nacked one is left to its Channel, and one that
// makes the broker close conn is blamed (blame). A suspect without a
// confirm within NackGiveUp (minProbeWait at least) ends the search: the broker is not confirming
// (a quorum queue without a majority), so the suspects go back to their
// Channels with conn and no key waits longer. It returns true once no
// suspect is left, false when conn was lost or p.ctx ended (conn is then
// closed). Meanwhile Connected and Node tell conn, ConfirmWait the wait for
// the probe's confirm, and p.ctx ending closes conn. Supervisor only.
func (p *Publisher) probe(conn *amqp.Connection, node string, ev connEvents) bool {
	stop := context.AfterFunc(p.ctx, func() { p.closeAfterProbe(conn) })
	defer stop()
	p.setProbe(conn, node)
	var pc *probeChannel
	defer func() {
		if pc != nil {
			pc.close()
		}
	}()
	for len(p.suspects) > 0 {
		s := p.suspects[0]
		// A closed Channel's owner gave its messages up: they are not sent.
		s.c.mu.Lock()
		done := s.e.resolved || s.c.closed
		s.c.mu.Unlock()
		if done {
			p.suspects = p.suspects[1:]
			continue
		}
		if reason := sizeRefusal(conn, s.e.headerSize, &Message{}, 0); reason != "" && !p.noSizeCheck {
			// Over this connection's frame_max: not sent (Publish, sendLocked).
			s.c.resolveFromPublisher(s.e, Returned, amqp.ContentTooLarge, reason)
			p.suspects = p.suspects[1:]
			continue
		}
		if pc == nil {
			var err error
			if pc, err = openProbeChannel(conn); err != nil {
				p.log.Warn("open an AMQP channel to find the message that closed the connection", zap.Error(err))
				p.closeAfterProbe(conn)
				return false
			}
		}
		out, cerr := p.probeOne(pc, s, conn, ev)
		switch out {
		case probeCleared:
			if pc.ch.IsClosed() {
				pc = nil
			}
		case probeConnClosed:
			pc = nil
			if cerr != nil && cerr.Server && blameConnCode(cerr.Code) {
				p.blame(s, cerr)
			}
			p.log.Warn("AMQP connection lost while finding the message that closed the previous one", zap.Error(cerr))
			return false
		case probeStopped:
			p.closeAfterProbe(conn)
			return false
		case probeTimedOut:
			p.log.Warn("the broker did not confirm a message within the nack give-up time while finding the message that closed the connection; "+
				"handing the connection and the messages back to the Channels",
				zap.Duration("waited", p.cfg.NackGiveUp), zap.Int("suspects_left", len(p.suspects)))
			p.suspects = nil
			return true
		}
		p.suspects = p.suspects[1:]
	}
	return true
}

// probeOne publishes s alone on pc and resolves it when the broker
// confirmed or returned it.
func (p *Publisher) probeOne(pc *probeChannel, s suspect, conn *amqp.Connection, ev connEvents) (probeOutcome, *amqp.Error) {
	p.setProbeWait(time.Now())
	defer p.setProbeWait(time.Time{})
	out, cerr := pc.publish(p, &s.e.msg, conn, ev)
	switch out {
	case probeConfirmed:
		s.c.resolveFromPublisher(s.e, Confirmed, 0, "")
	case probeReturned:
		s.c.resolveFromPublisher(s.e, Returned, amqp.NoRoute, "312 NO_ROUTE")
	}
	return out, cerr
}

// closeAfterProbe closes conn, which the probe does not hand to the
// Channels (p.ctx ended, or no probe channel could be opened), bounded: a
// broker that blocks us may not answer close-ok.
func (p *Publisher) closeAfterProbe(conn *amqp.Connection) {
	if !conn.IsClosed() {
		_ = conn.CloseDeadline(time.Now().Add(2 * time.Second))
	}
}

// probeChannel is the Publisher's channel in confirm mode for probes.
type probeChannel struct {
	ch      *amqp.Channel
	closes  chan *amqp.Error
	returns chan amqp.Return
}

func openProbeChannel(conn *amqp.Connection) (*probeChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	pc := &probeChannel{
		ch:      ch,
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
		returns: ch.NotifyReturn(make(chan amqp.Return, 1)), // one message on the wire at a time
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	return pc, nil
}

func (pc *probeChannel) close() {
	if !pc.ch.IsClosed() {
		_ = pc.ch.Close()
	}
}

// publish sends m alone and waits for its outcome, at most p's NackGiveUp
// (minProbeWait at least),
// recording connection.blocked meanwhile; for probeConnClosed it also
// returns the connection's close error (nil when closed by the client).
func (pc *probeChannel) publish(p *Publisher, m *Message, conn *amqp.Connection, ev connEvents) (probeOutcome, *amqp.Error) {
	connClosed := func() (probeOutcome, *amqp.Error) {
		// amqp091 notifies the connection's close before it closes the
		// channels, so the error is there (nil once taken).
		return probeConnClosed, <-ev.closes
	}
	dc, err := pc.ch.PublishWithDeferredConfirm(m.Exchange, m.RoutingKey, true, false, m.Publishing)
	if err != nil {
		if conn.IsClosed() {
			return connClosed()
		}
		return probeCleared, nil
	}
	timeout := time.NewTimer(max(p.cfg.NackGiveUp, minProbeWait))
	defer timeout.Stop()
	for waiting := true; waiting; {
		select {
		case <-p.ctx.Done():
			return probeStopped, nil
		case <-timeout.C:
			return probeTimedOut, nil
		case b, ok := <-ev.blocks:
			if !ok {
				ev.blocks = nil
			} else {
				p.noteBlocked(b)
			}
		case cerr := <-ev.closes:
			if !ackedBefore(dc) {
				return probeConnClosed, cerr
			}
			waiting = false
		case <-pc.closes:
			if !ackedBefore(dc) {
				if conn.IsClosed() {
					return connClosed()
				}
				return probeCleared, nil
			}
			waiting = false
		case <-dc.Done():
			waiting = false
		}
	}
	if !dc.Acked() {
		// A channel or connection that closes settles the publish as a
		// nack: tell that from the broker's own nack.
		if conn.IsClosed() {
			return connClosed()
		}
		return probeCleared, nil
	}
	select {
	case <-pc.returns: // a basic.return comes before its ack
		return probeReturned, nil
	default:
		return probeConfirmed, nil
	}
}

// ackedBefore reports whether dc was acked: select picks at random among
// ready cases, so an ack that arrived just before a close may be seen
// second. A close settles an unconfirmed publish as a nack, never an ack.
func ackedBefore(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return dc.Acked()
	default:
		return false
	}
}
