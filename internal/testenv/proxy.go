package testenv

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
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
	held     *portHold    // while disabled: the port, bound and not listening
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
//
// The port stays the proxy's meanwhile (bound, not listening: a connection
// attempt is refused), so no other test's server can take it and answer in
// the proxy's place, and Enable finds it free.
func (p *FaultProxy) Disable() {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil // the accept loop lets nothing through from now on
	p.mu.Unlock()
	// Reset (no TIME_WAIT) the connections on the port before it is held.
	p.Cut()
	if ln == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = ln.Close()
	if !p.closed {
		var h *portHold
		err := retryInUse(func() (err error) { h, err = holdPort(p.addr); return err })
		if err != nil {
			p.t.Logf("testenv: proxy %s: keep the port while disabled: %v", p.addr, err)
		}
		p.held = h
	}
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
	p.held.release()
	p.held = nil
	var ln net.Listener
	err := retryInUse(func() (err error) { ln, err = net.Listen("tcp", p.addr); return err })
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
	p.held.release()
	p.held = nil
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

// portHold is a TCP socket bound to a port and not listening: connections
// to the port are refused, and no other socket can bind it.
type portHold struct{ fd int }

// holdPort binds addr (host:port of a local IP) without listening. It
// binds without SO_REUSEADDR where it can, so that no other socket, a
// listener with SO_REUSEADDR included, can bind the port while it is held.
// While a socket of the port is in TIME_WAIT that fails, and it binds with
// SO_REUSEADDR: the kernel then still gives the port to no socket that asks
// for any free port (the way tests pick theirs), though a listener with
// SO_REUSEADDR asking for this very port could take it.
func holdPort(addr string) (*portHold, error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, err
	}
	var sa syscall.Sockaddr
	family := syscall.AF_INET
	if ip4 := ta.IP.To4(); ip4 != nil {
		sa4 := &syscall.SockaddrInet4{Port: ta.Port}
		copy(sa4.Addr[:], ip4)
		sa = sa4
	} else {
		family = syscall.AF_INET6
		sa6 := &syscall.SockaddrInet6{Port: ta.Port}
		copy(sa6.Addr[:], ta.IP.To16())
		sa = sa6
	}
	bind := func(reuse bool) (*portHold, error) {
		fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("socket: %w", err)
		}
		if reuse {
			if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
				syscall.Close(fd)
				return nil, fmt.Errorf("SO_REUSEADDR: %w", err)
			}
		}
		if err := syscall.Bind(fd, sa); err != nil {
			syscall.Close(fd)
			return nil, fmt.Errorf("bind %s: %w", addr, err)
		}
		return &portHold{fd: fd}, nil
	}
	h, err := bind(false)
	if errors.Is(err, syscall.EADDRINUSE) {
		h, err = bind(true)
	}
	return h, err
}

// retryInUse calls bind until it returns anything but EADDRINUSE, for at
// most inUseWait. A socket closed a moment ago can still hold its port: a
// process forked by another test (a server starting) holds a copy of every
// descriptor until it execs, close-on-exec ones included, so the proxy's
// listener (or hold) stays bound until then.
func retryInUse(bind func() error) error {
	deadline := time.Now().Add(inUseWait)
	for {
		err := bind()
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// inUseWait bounds retryInUse.
const inUseWait = 2 * time.Second

// release closes the socket; a nil hold is a no-op.
func (h *portHold) release() {
	if h != nil {
		syscall.Close(h.fd)
	}
}
