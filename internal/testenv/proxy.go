package testenv

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// FaultProxy is a TCP proxy on 127.0.0.1 in front of one upstream address that
// a test uses to cut, refuse or delay the connections of the code under test.
// Its methods are safe for concurrent use. It is closed at cleanup.
//
// It is written here rather than taken from toxiproxy: toxiproxy's library
// needs an API server and a Prometheus registry to create a proxy, and its only
// way to drop live connections is to stop the proxy, which also closes the
// listener, so "close every connection but keep accepting" (Cut) would refuse
// connections for a moment and rebind the port.
type FaultProxy struct {
	t    testing.TB
	addr string // fixed at creation; kept across Disable/Enable

	mu       sync.Mutex
	upstream string       // Retarget changes it
	ln       net.Listener // nil while disabled
	conns    map[*proxyConn]struct{}
	latency  time.Duration
	stalled  bool   // Stall: accept, forward nothing
	cuts     uint64 // number of Cut calls: a connection accepted before one is not let through
	closed   bool
	wg       sync.WaitGroup // accept loops and copy goroutines
}

// proxyConn is one proxied connection: the client side and the upstream side
// (nil for a connection accepted while stalled).
type proxyConn struct {
	client, upstream net.Conn
	done             chan struct{} // closed when the pair is being closed
	once             sync.Once
}

// close resets both sides (SO_LINGER 0: like a network failure, not a
// graceful FIN).
func (c *proxyConn) close() {
	c.once.Do(func() {
		close(c.done)
		for _, conn := range []net.Conn{c.client, c.upstream} {
			if conn == nil {
				continue
			}
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = conn.Close()
		}
	})
}

// proxyDialTimeout bounds the connection to the upstream per accepted client.
const proxyDialTimeout = 5 * time.Second

// Proxy starts a TCP fault proxy on 127.0.0.1 (a free port) in front of
// upstream (host:port) and closes it at cleanup. It passes bytes through
// unchanged until told otherwise.
func Proxy(t testing.TB, upstream string) *FaultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: listen for a proxy to %s: %v", upstream, err)
	}
	p := &FaultProxy{
		t:        t,
		addr:     ln.Addr().String(),
		upstream: upstream,
		ln:       ln,
		conns:    make(map[*proxyConn]struct{}),
	}
	p.wg.Add(1)
	go p.accept(ln)
	t.Cleanup(p.close)
	return p
}

// Addr returns the proxy's listening address (127.0.0.1:port); it stays the
// same across Disable and Enable.
func (p *FaultProxy) Addr() string { return p.addr }

// Retarget sends new connections to upstream (host:port) from now on and
// cuts the open ones, like a virtual IP or a proxy moved to another server
// after a failover.
func (p *FaultProxy) Retarget(upstream string) {
	p.mu.Lock()
	p.upstream = upstream
	p.mu.Unlock()
	p.Cut()
}

// Cut closes every open connection now (the peers see a reset); new
// connections are still accepted. When Cut returns no connection opened
// before it is left.
func (p *FaultProxy) Cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = make(map[*proxyConn]struct{})
	p.cuts++
	p.mu.Unlock()
	for c := range conns {
		c.close()
	}
}

// Disable closes every connection and refuses new ones (connection refused)
// until Enable.
func (p *FaultProxy) Disable() {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	p.Cut()
}

// Enable accepts connections again after Disable, on the same address. It
// fails the test when the address cannot be listened on again.
func (p *FaultProxy) Enable() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil || p.closed {
		return
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Errorf("testenv: re-enable proxy on %s: %v", p.addr, err)
		return
	}
	p.ln = ln
	p.wg.Add(1)
	go p.accept(ln)
}

// SetLatency delays every chunk of data passing through, in each direction, by
// d before forwarding it (chunks of one direction are delayed in turn, so bulk
// transfers slow down too); 0 removes the delay. It applies to open
// connections as well as new ones.
func (p *FaultProxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Stall makes the proxy a black hole, like a network that silently drops
// every packet: connections are still accepted (new ones reach no upstream),
// but nothing passes in either direction, on open connections or new ones,
// until Unstall. Peers notice only through their own timeouts.
func (p *FaultProxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// Unstall ends a Stall. The connections open during it lost data, so they
// are closed (like Cut); new ones pass through again.
func (p *FaultProxy) Unstall() {
	p.mu.Lock()
	p.stalled = false
	p.mu.Unlock()
	p.Cut()
}

func (p *FaultProxy) isStalled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stalled
}

func (p *FaultProxy) currentLatency() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency
}

// close stops the proxy for good: no listener, no connections, no goroutines.
func (p *FaultProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Disable()
	p.wg.Wait()
}

func (p *FaultProxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		client, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.t.Logf("testenv: proxy %s: accept: %v", p.addr, err)
			}
			return
		}
		p.mu.Lock()
		cutsAtAccept := p.cuts
		if p.stalled {
			if p.ln != ln { // disabled meanwhile
				p.mu.Unlock()
				_ = client.Close()
				return
			}
			// Held open, connected to nothing: what the client sends is read
			// and dropped until a Cut or Unstall closes it.
			c := &proxyConn{client: client, done: make(chan struct{})}
			p.conns[c] = struct{}{}
			p.wg.Add(1)
			p.mu.Unlock()
			go p.pipe(c, client, io.Discard)
			continue
		}
		target := p.upstream
		p.mu.Unlock()
		upstream, err := net.DialTimeout("tcp", target, proxyDialTimeout)
		if err != nil {
			// To the client this looks like the upstream closing at once.
			_ = client.Close()
			continue
		}
		c := &proxyConn{client: client, upstream: upstream, done: make(chan struct{})}
		p.mu.Lock()
		if p.ln != ln { // disabled meanwhile
			p.mu.Unlock()
			c.close()
			return
		}
		if p.cuts != cutsAtAccept { // cut while we dialled the upstream
			p.mu.Unlock()
			c.close()
			continue
		}
		p.conns[c] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, client, upstream)
		go p.pipe(c, upstream, client)
	}
}

// pipe copies from src to dst, applying the latency and dropping what
// arrives while stalled, and closes the pair when either side ends.
func (p *FaultProxy) pipe(c *proxyConn, src net.Conn, dst io.Writer) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		c.close()
	}()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 && p.isStalled() {
			n = 0
		}
		if n > 0 {
			if d := p.currentLatency(); d > 0 {
				timer := time.NewTimer(d)
				select {
				case <-timer.C:
				case <-c.done:
					timer.Stop()
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF, a reset or a Cut: the pair is closed on return
			return
		}
	}
}
