package canal

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestRetryCountsHangingAttempts: behind a black hole (connections accepted,
// nothing answered) each attempt lasts a whole ReadTimeout, longer than
// RetryMax, yet OnRetry's attempt counts up: a connection that yields nothing
// is not progress, however long it lives. Once the stream has delivered
// again, the next failure is attempt 1.
func TestRetryCountsHangingAttempts(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	ctx := testCtx(t)
	proxy := testenv.Proxy(t, net.JoinHostPort(db.Host, strconv.Itoa(db.Port)))
	_, port, err := net.SplitHostPort(proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	cfg := tailerConfig(t, db)
	cfg.Port, _ = strconv.Atoi(port)
	cfg.HeartbeatPeriod, cfg.ReadTimeout = 200*time.Millisecond, 600*time.Millisecond
	cfg.RetryMin, cfg.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	attempts := make(chan int, 100)
	cfg.OnRetry = func(_ error, attempt int) { attempts <- attempt }
	tl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	next := func() int {
		t.Helper()
		select {
		case a := <-attempts:
			return a
		case <-ctx.Done():
			t.Fatal("no reconnect attempt")
			return 0
		}
	}

	proxy.Stall()
	c := &collector{}
	r := startRun(t, tl, currentPosition(t, db.SQL), c)
	for want := 1; want <= 3; want++ {
		if got := next(); got != want {
			t.Fatalf("hanging connections: attempt %d reported as %d", want, got)
		}
	}

	proxy.Unstall()
	if err := insertRecords(ctx, db.SQL, newRecords(1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, func() bool { got, _ := c.snapshot(); return len(got) == 1 })
	// OnRetry runs before the reconnect that delivered the row: every
	// attempt of the stall has been reported by now.
	for len(attempts) > 0 {
		<-attempts
	}
	proxy.Cut()
	if got := next(); got != 1 {
		t.Fatalf("first failure after the stream delivered: attempt %d, want 1", got)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}
