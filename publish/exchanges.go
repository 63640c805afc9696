package publish

import (
	"context"
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/backoff"
)

// Exchange checks: before a Channel accepts a message to an exchange the
// Publisher does not know to exist, the Publisher asks the broker with a
// passive exchange.declare on a side channel of its connection (see "Exchanges
// that do not exist" in the package documentation).

// exchangeCheck is one request to the checker goroutine.
type exchangeCheck struct {
	name  string
	reply chan verdict // buffered: the checker never waits for the asker
}

// verdict is what a check found out about an exchange.
type verdict struct {
	// missing is the broker's 404 when the exchange does not exist, nil
	// otherwise.
	missing *amqp.Error
}

// knownExchange reports whether name is known to exist: the default
// exchange always does (and the broker refuses to declare it, even
// passively), the others once a check found them.
func (p *Publisher) knownExchange(name string) bool {
	if name == "" {
		return true
	}
	p.exMu.Lock()
	defer p.exMu.Unlock()
	_, ok := p.exchanges[name]
	return ok
}

// forgetExchange drops name from the exchanges known to exist, after the
// broker closed a channel with 404 over a publish that may have gone to it;
// the next message to it is checked again.
func (p *Publisher) forgetExchange(name string) {
	p.exMu.Lock()
	defer p.exMu.Unlock()
	delete(p.exchanges, name)
}

func (p *Publisher) rememberExchange(name string) {
	p.exMu.Lock()
	defer p.exMu.Unlock()
	p.exchanges[name] = struct{}{}
}

// reportMissing logs, once per name for the Publisher's life, that exchange
// name does not exist: its messages go to outbox_failed until it is declared.
func (p *Publisher) reportMissing(name string) {
	p.exMu.Lock()
	_, done := p.reported[name]
	if p.reported == nil {
		p.reported = map[string]struct{}{}
	}
	p.reported[name] = struct{}{}
	p.exMu.Unlock()
	if !done {
		p.log.Warn("exchange not found on the broker: its messages go to outbox_failed until it is declared "+
			"(with a queue bound); then retry them with 'outbox-relay failed retry'", zap.String("exchange", name))
	}
}

// checkExchange returns the broker's 404 when exchange name does not exist,
// nil when it exists (or when the broker answered something else: the
// publish then goes ahead and any channel exception it causes is handled
// like before the check existed). It returns ctx.Err() when ctx ends first
// and ErrClosed when stop is closed or the Publisher ends. A known exchange
// costs no round trip.
func (p *Publisher) checkExchange(ctx context.Context, stop <-chan struct{}, name string) (*amqp.Error, error) {
	if p.knownExchange(name) {
		return nil, nil
	}
	req := exchangeCheck{name: name, reply: make(chan verdict, 1)}
	select {
	case p.checks <- req:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-stop:
		return nil, ErrClosed
	case <-p.ctx.Done():
		return nil, ErrClosed
	}
	select {
	case v := <-req.reply:
		if v.missing != nil {
			p.reportMissing(name)
		}
		return v.missing, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-stop:
		return nil, ErrClosed
	case <-p.ctx.Done():
		return nil, ErrClosed
	}
}

// sideChannel is the checker's AMQP channel and the connection it is on.
type sideChannel struct {
	conn *amqp.Connection
	ch   *amqp.Channel
}

// checkExchanges answers exchange checks one at a time until p.ctx ends.
// Its side channel goes down with the connection, which the supervisor
// closes when p.ctx ends.
func (p *Publisher) checkExchanges() {
	defer p.wg.Done()
	var side sideChannel
	for {
		select {
		case <-p.ctx.Done():
			return
		case req := <-p.checks:
			if p.knownExchange(req.name) {
				req.reply <- verdict{}
				continue
			}
			v, ok := p.askBroker(&side, req.name)
			if !ok {
				return
			}
			req.reply <- v
		}
	}
}

// askBroker declares exchange name passively on side, (re)opening side on
// the current connection as needed and retrying across connection losses.
// ok is false when p.ctx ended first.
func (p *Publisher) askBroker(side *sideChannel, name string) (v verdict, ok bool) {
	bo := backoff.Counter{Min: p.cfg.ReconnectMin, Max: p.cfg.ReconnectMax}
	for {
		conn := p.awaitConn(p.ctx.Done())
		if conn == nil {
			return verdict{}, false
		}
		if side.ch == nil || side.conn != conn || side.ch.IsClosed() {
			ch, err := conn.Channel()
			if err != nil {
				if !conn.IsClosed() {
					p.log.Warn("open AMQP channel for exchange checks", zap.Error(err))
				}
				if !backoff.Sleep(p.ctx, bo.Next()) {
					return verdict{}, false
				}
				continue
			}
			*side = sideChannel{conn: conn, ch: ch}
		}
		// Passive: the kind and flags are not compared, only existence.
		err := side.ch.ExchangeDeclarePassive(name, "", false, false, false, false, nil)
		if err == nil {
			p.rememberExchange(name)
			return verdict{}, true
		}
		var aerr *amqp.Error
		isAMQP := errors.As(err, &aerr)
		switch {
		case conn.IsClosed():
			// The connection went down under the check: ask again on the next.
			side.ch = nil
			continue
		case !isAMQP || !aerr.Server:
			side.ch = nil
			if !backoff.Sleep(p.ctx, bo.Next()) {
				return verdict{}, false
			}
			continue
		case aerr.Code == amqp.NotFound:
			// The broker closed the side channel; the next check reopens it.
			side.ch = nil
			return verdict{missing: aerr}, true
		default:
			// Neither yes nor no (a broker that refuses passive declares,
			// say): let the message go; the channel exception its publish
			// may cause is handled as if there had been no check.
			side.ch = nil
			p.log.Warn("exchange check failed, publishing without it",
				zap.String("exchange", name), zap.Error(err))
			return verdict{}, true
		}
	}
}
