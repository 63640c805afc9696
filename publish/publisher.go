package publish

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/backoff"
	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// ErrClosed is returned by the methods of a closed Publisher or Channel, and
// by Publish and Flush once the Publisher's context has ended.
var ErrClosed = errors.New("publish: closed")

// dialTimeout bounds the TCP connect and the AMQP handshake of one dial
// attempt; heartbeats take over once the connection is open.
const dialTimeout = 10 * time.Second

// Publisher owns one AMQP connection and redials it with jittered backoff
// while the context given to New lives. Its Channels reopen on every new
// connection. Safe for concurrent use.
type Publisher struct {
	cfg    Config
	log    *zap.Logger
	ctx    context.Context // ends on Close or when New's ctx ends
	cancel context.CancelFunc
	wg     sync.WaitGroup // the supervisor and the exchange checker goroutines

	// checks feeds the exchange checker (exchanges.go), which answers one
	// at a time; exchanges holds the exchanges known to exist, reported
	// those found missing and already logged (once per name).
	checks    chan exchangeCheck
	exMu      sync.Mutex
	exchanges map[string]struct{}
	reported  map[string]struct{}

	mu       sync.Mutex
	conn     *amqp.Connection // nil while down
	blocked  bool             // connection.blocked in force on conn
	finished bool             // supervisor gone: no connection ever again
	changed  chan struct{}    // closed and replaced when conn, blocked or finished change
	channels map[*Channel]struct{}
	closed   bool
}

// New validates cfg and dials once, so a bad URL, bad credentials, a vhost
// the user may not use or a TLS failure fail at once with a clear error (a
// refusal, see IsRefused, is fatal unless cfg.RetryRefused). When the broker
// cannot be reached (connection refused, timeout) New still succeeds and keeps dialling in the background: a relay may start
// before its broker. The Publisher lives until Close or until ctx ends; after
// ctx ends Publish and Flush return ErrClosed, and Close must still be called.
func New(ctx context.Context, cfg Config) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	p := &Publisher{
		cfg:      cfg,
		log:      cfg.Logger.With(zap.String("amqp_url", redact.URL(cfg.URL))),
		ctx:      pctx,
		cancel:   cancel,
		changed:  make(chan struct{}),
		channels: map[*Channel]struct{}{},

		checks:    make(chan exchangeCheck),
		exchanges: map[string]struct{}{},
	}
	conn, err := p.dial()
	if err != nil {
		if IsRefused(err) && !cfg.RetryRefused {
			cancel()
			return nil, err
		}
		p.log.Warn("cannot connect to the AMQP broker, retrying in the background", zap.Error(err))
	}
	p.noteDial(err)
	p.wg.Add(2)
	go p.supervise(conn)
	go p.checkExchanges()
	return p, nil
}

// dial opens a connection with the configured options, reading their files
// again (a rotated password takes effect here), under a batchConn.
func (p *Publisher) dial() (*amqp.Connection, error) {
	return dial(p.ctx, p.cfg.URL, p.cfg.Conn, "outbox-relay publish", func(c net.Conn) net.Conn { return newBatchConn(c) })
}

func (p *Publisher) noteDial(err error) {
	if p.cfg.OnDial != nil {
		p.cfg.OnDial(err)
	}
}

// supervise owns the connection: it watches it, tracks connection.blocked
// and redials after a loss until p.ctx ends.
func (p *Publisher) supervise(conn *amqp.Connection) {
	defer p.wg.Done()
	defer p.finish()
	bo := backoff.Counter{Min: p.cfg.ReconnectMin, Max: p.cfg.ReconnectMax}
	everConnected := conn != nil
	for {
		if conn == nil {
			if !backoff.Sleep(p.ctx, bo.Next()) {
				return
			}
			var err error
			conn, err = p.dial()
			if err != nil {
				if p.ctx.Err() != nil {
					return
				}
				p.log.Warn("dial AMQP broker", zap.Error(err))
				p.noteDial(err)
				continue
			}
			p.noteDial(nil)
			if everConnected {
				p.log.Info("reconnected to AMQP broker")
				if p.cfg.OnReconnect != nil {
					p.cfg.OnReconnect()
				}
			} else {
				p.log.Info("connected to AMQP broker")
			}
			everConnected = true
		}
		bo.Reset()
		if !p.watch(conn) {
			return
		}
		conn = nil
	}
}

// watch publishes conn to the Channels and returns when it is lost (true) or
// when p.ctx ended (false; conn is then closed).
func (p *Publisher) watch(conn *amqp.Connection) bool {
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	// amqp091 gives up on a listener that does not take a notification
	// within 5s; this goroutine always takes them at once.
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 8))
	p.setConn(conn)
	for {
		select {
		case <-p.ctx.Done():
			p.setConn(nil)
			// Bounded: a broker that blocks us may not answer close-ok.
			_ = conn.CloseDeadline(time.Now().Add(2 * time.Second))
			return false
		case b, ok := <-blocks:
			if !ok {
				blocks = nil
				continue
			}
			if b.Active {
				p.log.Warn("AMQP broker blocked publishing", zap.String("reason", b.Reason))
			} else {
				p.log.Info("AMQP broker unblocked publishing")
			}
			p.setBlocked(b.Active)
		case err := <-closes:
			p.setConn(nil)
			if err != nil {
				p.log.Warn("AMQP connection lost", zap.Error(err))
			} else {
				p.log.Warn("AMQP connection closed")
			}
			if !conn.IsClosed() {
				_ = conn.CloseDeadline(time.Now().Add(2 * time.Second))
			}
			return true
		}
	}
}

func (p *Publisher) setConn(conn *amqp.Connection) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conn = conn
	// A new connection starts unblocked; the broker says again if not.
	p.blocked = false
	p.notifyLocked()
}

func (p *Publisher) setBlocked(b bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = b
	p.notifyLocked()
}

func (p *Publisher) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conn = nil
	p.finished = true
	p.notifyLocked()
}

func (p *Publisher) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Blocked reports whether the broker has blocked this connection
// (connection.blocked, a memory or disk alarm). Publish waits while it is.
func (p *Publisher) Blocked() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blocked
}

// Connected reports whether the Publisher has an open connection to the
// broker, and returns a channel closed at the next change of that (or of
// blocking). While it is down nothing can be confirmed: a stop need not wait
// for confirms then, what is unconfirmed is published again anyway.
func (p *Publisher) Connected() (bool, <-chan struct{}) {
	conn, _, _, changed := p.state()
	return conn != nil && !conn.IsClosed(), changed
}

// state returns the current connection (nil while down), whether publishing
// is blocked, whether the Publisher is finished, and a channel closed at the
// next change of any of these.
func (p *Publisher) state() (conn *amqp.Connection, blocked, finished bool, changed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn, p.blocked, p.finished, p.changed
}

// awaitConn waits for an open connection; nil when the Publisher is finished
// or stop is closed.
func (p *Publisher) awaitConn(stop <-chan struct{}) *amqp.Connection {
	for {
		conn, _, finished, changed := p.state()
		if finished {
			return nil
		}
		if conn != nil && !conn.IsClosed() {
			return conn
		}
		select {
		case <-changed:
		case <-stop:
			return nil
		}
	}
}

// Close closes every Channel, then the connection, and waits for all their
// goroutines. Messages still without a Result get none. Idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	chans := make([]*Channel, 0, len(p.channels))
	for c := range p.channels {
		chans = append(chans, c)
	}
	p.mu.Unlock()
	// The connection goes first: its close is bounded, and it ends every
	// channel at once instead of one channel.close round trip each.
	p.cancel()
	p.wg.Wait()
	var errs []error
	for _, c := range chans {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

func (p *Publisher) register(c *Channel) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.finished {
		return ErrClosed
	}
	p.channels[c] = struct{}{}
	return nil
}

func (p *Publisher) unregister(c *Channel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.channels, c)
}
