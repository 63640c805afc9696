package relay

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// relayRun is a relay running in this process until the test ends.
type relayRun struct {
	r    *Relay
	done chan struct{} // closed when Run has returned
	err  error         // Run's result, once done is closed
	stop func() error  // shuts the relay down like SIGTERM and returns Run's result
}

// runRelay runs a relay built from cfg after tweak (nil for none) has
// adjusted it, e.g. to send its binlog connection through a proxy.
func runRelay(t *testing.T, cfg Config, tweak func(*Relay)) *relayRun {
	t.Helper()
	if cfg.ServerID == 0 {
		cfg.ServerID = testenv.ServerID(t)
	}
	if cfg.RelayName == "" {
		dsn, err := mysql.ParseDSN(cfg.MySQLDSN)
		if err != nil {
			t.Fatalf("relay DSN: %v", err)
		}
		cfg.RelayName = relayNameFor(dsn.DBName)
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t).Named("relay")
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("new relay: %v", err)
	}
	if tweak != nil {
		tweak(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rr := &relayRun{r: r, done: make(chan struct{})}
	go func() {
		defer close(rr.done)
		rr.err = r.Run(ctx)
	}()
	var once sync.Once
	var stopErr error
	rr.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case <-rr.done:
				stopErr = rr.err
			case <-time.After(time.Minute):
				stopErr = fmt.Errorf("relay did not stop within a minute of shutdown")
			}
			r.Close()
		})
		return stopErr
	}
	t.Cleanup(func() {
		if err := rr.stop(); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	return rr
}

// waitMode waits until the relay enters mode, failing at once if Run returns.
func waitMode(ctx context.Context, t *testing.T, m *modes, rr *relayRun, mode Mode) {
	t.Helper()
	for {
		select {
		case got := <-m.ch:
			if got == mode {
				return
			}
		case <-rr.done:
			t.Fatalf("relay stopped (Run returned %v) before entering %s mode", rr.err, mode)
		case <-ctx.Done():
			m.mu.Lock()
			defer m.mu.Unlock()
			t.Fatalf("relay never entered %s mode (modes so far: %v)", mode, m.seen)
		case <-time.After(progress.Patience):
			m.mu.Lock()
			defer m.mu.Unlock()
			t.Fatalf("relay did not enter %s mode within %v (modes so far: %v)", mode, progress.Patience, m.seen)
		}
	}
}

// waitFor waits until cond holds, failing at once if Run returns.
func waitFor(ctx context.Context, t *testing.T, rr *relayRun, what string, cond func() bool) {
	t.Helper()
	stopped := false
	err := progress.Wait(ctx, "wait until the relay is "+what, nil, func() bool {
		select {
		case <-rr.done:
			stopped = true
			return true
		default:
			return cond()
		}
	})
	if stopped {
		t.Fatalf("relay stopped (Run returned %v) before %s", rr.err, what)
	}
	if err != nil {
		t.Fatalf("relay not %s in time: %v", what, err)
	}
}

// An auto relay whose binlog connection hangs — a black hole between it and
// the server: connections accepted, nothing answered — while the database
// answers its SQL directly falls back to poll mode once the trouble has
// lasted --fallback-after, not before, although each failed attempt lasts a
// whole read timeout, longer than the tailer's backoff cap. Then it delivers
// by polling.
func TestFallsBackWhenBinlogConnectionHangs(t *testing.T) {
	t.Parallel()
	srv, db, b := privateSetup(t)
	proxy := testenv.Proxy(t, srv.Addr())
	v := consume(t, b, b.Queue)
	ctx := testenv.WorkContext(t)
	m := newModes()
	const fallbackAfter = 3 * time.Second
	var reason string
	var reasonMu sync.Mutex
	rr := runRelay(t, Config{
		MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, CheckpointInterval: time.Second,
		FallbackAfter: fallbackAfter, BinlogRetryInterval: time.Hour,
		OnMode: func(mode Mode, why string) {
			if mode == ModePoll {
				reasonMu.Lock()
				reason = why
				reasonMu.Unlock()
			}
			m.hook(mode, why)
		},
	}, func(r *Relay) {
		// Only the binlog connection goes through the proxy. A read timeout
		// longer than the backoff cap: each hanging attempt outlives it.
		r.canal.Host, r.canal.Port = "127.0.0.1", portOf(t, proxy.Addr())
		r.canal.HeartbeatPeriod, r.canal.ReadTimeout = 300*time.Millisecond, time.Second
		r.canal.RetryMin, r.canal.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	})
	waitMode(ctx, t, m, rr, ModeBinlog)
	produce(ctx, t, db, b, v, load{producers: 2, partitions: 10, total: 200, bigTxn: 10, bigShare: 0.2})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}

	proxy.Stall()
	stalled := time.Now()
	waitMode(ctx, t, m, rr, ModePoll)
	if d := time.Since(stalled); d < fallbackAfter {
		t.Errorf("fell back %v after the binlog connection hung, before --fallback-after %v", d, fallbackAfter)
	}
	reasonMu.Lock()
	why := reason
	reasonMu.Unlock()
	if !strings.Contains(why, "binlog unreadable") {
		t.Errorf("poll mode reason %q, want the binlog trouble", why)
	}

	produce(ctx, t, db, b, v, load{producers: 2, partitions: 10, total: 200, bigTxn: 10, bigShare: 0.2})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	var port int
	if _, err := fmt.Sscan(addr[i+1:], &port); err != nil {
		t.Fatalf("port of %q: %v", addr, err)
	}
	return port
}
