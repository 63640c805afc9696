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
// while the context given to New lives, going through the URLs of
// Config.URL in turn (one dial per backoff step, starting with the URL after
// the node whose connection was lost). Its Channels reopen on every new
// connection. Safe for concurrent use.
type Publisher struct {
	cfg    Config
	urls   []string // Config.URL split; dialled in turn
	next   int      // index in urls of the next dial; supervisor only (and New before it starts)
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

	// suspects are the messages that were on the wire when the broker
	// closed the connection over one of them (blame.go); the supervisor
	// publishes them one at a time on the next connection before the
	// Channels get it. Supervisor only.
	suspects []suspect
	// noSizeCheck sends messages over the connection's limits: only tests
	// of what the broker does with them set it, before any Publish.
	noSizeCheck bool

	mu   sync.Mutex
	conn *amqp.Connection // nil while down, and while the probe has the connection
	node string           // host:port of conn's (or probeConn's) broker node, "" while down
	// probeConn is the connection the probe (blame.go) has before the
	// Channels get it, nil when none; probeWait is when its unconfirmed
	// publish went out, zero when none is.
	probeConn *amqp.Connection
	probeWait time.Time
	blocked   bool          // connection.blocked in force on conn
	finished  bool          // supervisor gone: no connection ever again
	changed   chan struct{} // closed and replaced when conn, blocked or finished change
	channels  map[*Channel]struct{}
	closed    bool
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
	urls, _ := SplitURLs(cfg.URL) // Validate checked it
	pctx, cancel := context.WithCancel(ctx)
	p := &Publisher{
		cfg:      cfg,
		urls:     urls,
		log:      cfg.Logger.With(zap.String("amqp_url", redact.URL(cfg.URL))),
		ctx:      pctx,
		cancel:   cancel,
		changed:  make(chan struct{}),
		channels: map[*Channel]struct{}{},

		checks:    make(chan exchangeCheck),
		exchanges: map[string]struct{}{},
	}
	// The first URL that answers; the others only when it does not.
	var conn *amqp.Connection
	var node string
	var err, refused error
	for range p.urls {
		if conn, node, err = p.dial(); err == nil {
			break
		}
		if IsRefused(err) && refused == nil {
			refused = err
		}
	}
	if conn == nil {
		if refused != nil && !cfg.RetryRefused {
			cancel()
			return nil, refused
		}
		p.log.Warn("cannot connect to the AMQP broker, retrying in the background", zap.Error(err))
	} else {
		p.log.Info("connected to AMQP broker", zap.String("node", node))
		p.setConn(conn, node) // Node answers from New's return on
	}
	p.wg.Add(2)
	go p.supervise(conn, node)
	go p.checkExchanges()
	return p, nil
}

// dial opens a connection to p.urls[p.next] with the configured options,
// reading their files again (a rotated password takes effect here), under a
// batchConn, and moves p.next on to the following URL, so that the dials
// go through the URLs in turn. It tells OnDial, and returns the node dialled
// (host:port).
func (p *Publisher) dial() (*amqp.Connection, string, error) {
	i := p.next
	p.next = (i + 1) % len(p.urls)
	node := nodeOf(p.urls[i])
	conn, err := dial(p.ctx, p.urls[i], p.cfg.Conn, "outbox-relay publish", func(c net.Conn) net.Conn { return newBatchConn(c) })
	if p.cfg.OnDial != nil && p.ctx.Err() == nil {
		p.cfg.OnDial(node, err)
	}
	return conn, node, err
}

// supervise owns the connection: it watches it, tracks connection.blocked
// and redials after a loss until p.ctx ends. The backoff before a dial
// starts again from ReconnectMin after a connection that was lost for a
// reason of its own (network, broker restart); after one the broker closed
// over a message, or lost while finding that message, it keeps growing, so
// a message that closes every connection never makes the loop spin.
func (p *Publisher) supervise(conn *amqp.Connection, node string) {
	defer p.wg.Done()
	defer p.finish()
	bo := backoff.Counter{Min: p.cfg.ReconnectMin, Max: p.cfg.ReconnectMax}
	everConnected := conn != nil
	var ev connEvents
	if conn != nil {
		ev = notifyConn(conn)
	}
	for {
		if conn == nil {
			if !backoff.Sleep(p.ctx, bo.Next()) {
				return
			}
			var err error
			conn, node, err = p.dial()
			if err != nil {
				if p.ctx.Err() != nil {
					return
				}
				p.log.Warn("dial AMQP broker", zap.Error(err))
				continue
			}
			ev = notifyConn(conn)
			if everConnected {
				p.log.Info("reconnected to AMQP broker", zap.String("node", node))
				if p.cfg.OnReconnect != nil {
					p.cfg.OnReconnect(node)
				}
			} else {
				p.log.Info("connected to AMQP broker", zap.String("node", node))
			}
			everConnected = true
		}
		if len(p.suspects) > 0 && !p.probe(conn, node, ev) {
			p.setConn(nil, "")
			if p.ctx.Err() != nil {
				return
			}
			conn = nil
			continue
		}
		lost, blamed := p.watch(conn, node, ev)
		if !lost {
			return
		}
		if !blamed {
			bo.Reset()
		}
		conn = nil
	}
}

// watch publishes conn to the Channels and returns when it is lost (lost
// true; also when it closed conn after Config.ConfirmStuckAfter without a
// confirmation) or when p.ctx ended (false; conn is then closed). blamed says that
// the broker closed conn over a message (blameConnCode): the messages that
// were on the wire are then p.suspects.
func (p *Publisher) watch(conn *amqp.Connection, node string, ev connEvents) (lost, blamed bool) {
	closes, blocks := ev.closes, ev.blocks
	p.setConn(conn, node)
	stuck := time.NewTicker(min(max(p.cfg.ConfirmStuckAfter/4, 10*time.Millisecond), 5*time.Second))
	defer stuck.Stop()
	// The wait counts from the end of the last connection.blocked seen:
	// a blocked broker confirms nothing, by design.
	var blockedAt time.Time
	for {
		select {
		case <-stuck.C:
			if p.Blocked() {
				blockedAt = time.Now()
				continue
			}
			wait := p.ConfirmWait()
			if !blockedAt.IsZero() {
				wait = min(wait, time.Since(blockedAt))
			}
			// A connection already closing is left to its close event
			// (which may blame a message).
			if wait > p.cfg.ConfirmStuckAfter && !conn.IsClosed() {
				p.log.Warn("no publisher confirms for a while on a connection that is up: closing it, to publish the unconfirmed messages again on a new one "+
					"(RabbitMQ before 4.2 can leave a channel's quorum-queue publishes unconfirmed for good after a node outage)",
					zap.String("node", node), zap.Duration("waited", wait))
				p.setConn(nil, "")
				_ = conn.CloseDeadline(time.Now().Add(2 * time.Second))
				return true, false
			}
		case <-p.ctx.Done():
			p.setConn(nil, "")
			// Bounded: a broker that blocks us may not answer close-ok.
			_ = conn.CloseDeadline(time.Now().Add(2 * time.Second))
			return false, false
		case b, ok := <-blocks:
			if !ok {
				blocks = nil
				continue
			}
			p.noteBlocked(b)
		case err := <-closes:
			p.setConn(nil, "")
			if err != nil {
				p.log.Warn("AMQP connection lost", zap.String("node", node), zap.Error(err))
			} else {
				p.log.Warn("AMQP connection closed", zap.String("node", node))
			}
			if !conn.IsClosed() {
				_ = conn.CloseDeadline(time.Now().Add(2 * time.Second))
			}
			// Known limit: after a frame error RabbitMQ sends
			// connection.close, stops reading for 3 s, then drops the
			// socket. A Channel blocked writing to it (holding amqp091's
			// send lock) can make amqp091 shut down with its own error
			// (Server false, 501 from the failed write) before it reads the
			// broker's close: that closure counts for no message, and the
			// backoff starts over. Blaming such a write error would fail
			// good messages on any network fault, so it is left uncounted.
			blamed = err != nil && err.Server && blameConnCode(err.Code)
			if blamed {
				p.collectSuspects(conn, err)
			}
			return true, blamed
		}
	}
}

func (p *Publisher) setConn(conn *amqp.Connection, node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if conn != nil && conn == p.conn {
		return // New set it already; a connection.blocked since then holds
	}
	// A new connection starts unblocked, the broker says again if not;
	// one the probe had keeps what the broker said during the probe.
	if conn == nil || conn != p.probeConn {
		p.blocked = false
	}
	p.conn, p.node = conn, node
	p.probeConn, p.probeWait = nil, time.Time{}
	p.notifyLocked()
}

// setProbe records that the probe has conn (to node) before the Channels:
// Connected and Node tell it, the Channels do not get it (state).
func (p *Publisher) setProbe(conn *amqp.Connection, node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conn, p.probeConn, p.node, p.blocked = nil, conn, node, false
	p.notifyLocked()
}

// setProbeWait records when the probe's unconfirmed publish went out (zero:
// none is), for ConfirmWait.
func (p *Publisher) setProbeWait(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probeWait = t
}

// noteBlocked logs and records a connection.blocked or unblocked.
func (p *Publisher) noteBlocked(b amqp.Blocking) {
	if b.Active {
		p.log.Warn("AMQP broker blocked publishing", zap.String("reason", b.Reason))
	} else {
		p.log.Info("AMQP broker unblocked publishing")
	}
	p.setBlocked(b.Active)
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
	p.conn, p.probeConn = nil, nil
	p.node = ""
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
// broker, the one it probes for the message that closed the previous one
// included, and returns a channel closed at the next change of that (or of
// blocking). While it is down nothing can be confirmed: a stop need not wait
// for confirms then, what is unconfirmed is published again anyway.
func (p *Publisher) Connected() (bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	conn := p.conn
	if conn == nil {
		conn = p.probeConn
	}
	return conn != nil && !conn.IsClosed(), p.changed
}

// Node returns the broker node the Publisher is connected to, as host:port
// (never with credentials), or "" while it is not connected.
func (p *Publisher) Node() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.node
}

// ConfirmWait is how long the Publisher has been waiting for the broker's
// confirmations: the longest time one of its Channels has had messages on
// the wire without receiving any confirmation (ack, nack), 0 when none has
// messages outstanding; the probe for a message that closed the connection
// (blame.go) counts as one. A broker that stopped confirming (a quorum queue
// without a majority of its nodes, a node under heavy load) makes it grow
// while the connection stays up. No I/O.
func (p *Publisher) ConfirmWait() time.Duration {
	now := time.Now()
	var longest time.Duration
	p.mu.Lock()
	if !p.probeWait.IsZero() {
		longest = now.Sub(p.probeWait)
	}
	chans := make([]*Channel, 0, len(p.channels))
	for c := range p.channels {
		chans = append(chans, c)
	}
	p.mu.Unlock()
	for _, c := range chans {
		c.mu.Lock()
		if !c.waitSince.IsZero() {
			longest = max(longest, now.Sub(c.waitSince))
		}
		c.mu.Unlock()
	}
	return longest
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
