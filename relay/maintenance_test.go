package relay

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// The maintenance hook runs on the leader only, at the start of its term
// and then every interval. A standby of the same relay name never calls it
// (checked after it was refused leadership three times), takes it over when
// it becomes the leader, and the old leader's calls stop with its term.
// The standby says it is one once at INFO, then at DEBUG.
func TestMaintenanceRunsOnTheLeaderOnly(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	ctx := testenv.Context(t, time.Minute)
	var first, second atomic.Int64
	hook := func(n *atomic.Int64) func(*Config) {
		return func(c *Config) {
			c.Mode = ModePoll
			c.Maintenance = func(context.Context) { n.Add(1) }
			c.MaintenanceInterval = 20 * time.Millisecond
		}
	}
	stopFirst := startRelay(t, db, b, hook(&first))
	maintWait(ctx, t, "the leader's maintenance to run 3 times", func() bool { return first.Load() >= 3 })

	core, logs := observer.New(zap.DebugLevel)
	cfg := Config{MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, ServerID: testenv.ServerID(t),
		Logger: zap.New(core), StandbyRetry: 20 * time.Millisecond, RelayName: relayNameFor(db.Name)}
	hook(&second)(&cfg)
	standby, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- standby.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("second relay: %v", err)
		}
	}()
	maintWait(ctx, t, "the second relay to be refused leadership 3 times", func() bool {
		return logs.FilterMessageSnippet("standby").Len() >= 3
	})
	if n := second.Load(); n != 0 {
		t.Fatalf("a standby ran maintenance %d times", n)
	}
	if n := logs.FilterMessageSnippet("standby").FilterLevelExact(zap.InfoLevel).Len(); n != 1 {
		t.Fatalf("the standby logged %d INFO lines saying so, want 1 (then DEBUG)", n)
	}

	if err := stopFirst(); err != nil {
		t.Fatal(err)
	}
	ended := first.Load()
	maintWait(ctx, t, "the new leader's maintenance to run 3 times", func() bool { return second.Load() >= 3 })
	if n := first.Load(); n != ended {
		t.Fatalf("the old leader ran maintenance %d times after its term ended", n-ended)
	}
}

func maintWait(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
