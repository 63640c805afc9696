package testenv_test

import (
	"database/sql"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// proxiedDB opens a pool to db's server through the proxy.
func proxiedDB(t *testing.T, db *testenv.DB, p *testenv.FaultProxy) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = p.Addr()
	cfg.Timeout = 2 * time.Second
	pool, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return pool
}

func TestProxyCutDisableEnable(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	p := testenv.Proxy(t, net.JoinHostPort(db.Host, itoa(db.Port)))
	pool := proxiedDB(t, db, p)

	conn, err := pool.Conn(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var one int
	if err := conn.QueryRowContext(ctx(t), "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("query through proxy: %v", err)
	}

	p.Cut()
	if err := conn.QueryRowContext(ctx(t), "SELECT 1").Scan(&one); err == nil {
		t.Fatal("query on a cut connection succeeded")
	}
	if got := scalar(t, pool, "SELECT DATABASE()"); got != db.Name {
		t.Fatalf("new connection after Cut: database %q", got)
	}

	p.Disable()
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("Disable: proxy still accepts connections")
	}
	// The port stays the proxy's while disabled: another test's server
	// taking it would answer in its place, and Enable would fail.
	if ln, err := net.Listen("tcp", p.Addr()); err == nil {
		ln.Close()
		t.Fatal("Disable: another listener could take the proxy's port")
	}
	if err := pool.PingContext(ctx(t)); err == nil {
		t.Fatal("Disable: ping through the proxy succeeded")
	}

	p.Enable()
	if got := scalar(t, pool, "SELECT 1"); got != "1" {
		t.Fatalf("after Enable: %q", got)
	}

	const latency = 250 * time.Millisecond
	p.SetLatency(latency)
	start := time.Now()
	scalar(t, pool, "SELECT 1")
	if d := time.Since(start); d < 2*latency {
		t.Fatalf("query with %v latency each way took only %v", latency, d)
	}
	p.SetLatency(0)
	start = time.Now()
	scalar(t, pool, "SELECT 1")
	if d := time.Since(start); d >= latency {
		t.Fatalf("query after SetLatency(0) took %v", d)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// Stall: an open connection and a new one get no answer (the client's own
// read deadline ends the wait: that bounded wait is the assertion); Unstall
// closes the stalled connections and new ones pass again.
func TestProxyStall(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	p := testenv.Proxy(t, net.JoinHostPort(db.Host, itoa(db.Port)))
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = p.Addr()
	cfg.Timeout, cfg.ReadTimeout = time.Second, 500*time.Millisecond
	pool, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	conn, err := pool.Conn(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	p.Stall()
	var one int
	if err := conn.QueryRowContext(ctx(t), "SELECT 1").Scan(&one); err == nil {
		t.Fatal("query on an open connection answered while stalled")
	}
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatalf("Stall: the proxy must still accept connections: %v", err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := c.Read(make([]byte, 64)); n > 0 || err == nil {
		t.Fatalf("a new connection got %d bytes while stalled (%v); want none until the deadline", n, err)
	}

	p.Unstall()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 64)); err == nil {
		t.Fatal("a connection opened during the stall is still open after Unstall")
	}
	if got := scalar(t, pool, "SELECT 1"); got != "1" {
		t.Fatalf("after Unstall: %q", got)
	}
}

// Disable refuses connections and Enable accepts them again while other
// tests start processes: a forked child holds a copy of the proxy's
// listening socket until it execs, so the port can stay bound a moment
// after the proxy closed it.
func TestProxyDisableWhileProcessesStart(t *testing.T) {
	p := testenv.Proxy(t, "127.0.0.1:1") // nothing is proxied: only the port matters
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = exec.Command("true").Run()
		}
	}()
	defer func() { close(stop); <-done }()
	for i := range 100 {
		p.Disable()
		if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
			c.Close()
			t.Fatalf("round %d: Disable: proxy still accepts connections", i)
		}
		p.Enable()
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err != nil {
			t.Fatalf("round %d: Enable: %v", i, err)
		}
		c.Close()
	}
}
