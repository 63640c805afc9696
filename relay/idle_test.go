package relay

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
)

// An idle relay sends at most one statement per heartbeat interval to the
// server (the heartbeat; 0.5/s at the default 2 s), and a standby adds at
// most one per two heartbeat intervals (0.25/s): counted with the private
// server's Questions status over a fixed number of heartbeat periods, the
// timings scaled down eightfold from the defaults (heartbeat 2 s, lease
// 10 s). The position update (--checkpoint-interval, 5 min), the lock
// connection's wait (5 min) and the binlog retention figure (10 min) come
// far less often than that and are not in the window.
func TestIdleRelayStatements(t *testing.T) {
	t.Parallel() // its own server: the statements counted are its relay's alone
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	ctx := testenv.WorkContext(t)
	db.Migrate(ctx, t)
	b := testenv.RabbitMQ(t)
	const (
		heartbeat = 250 * time.Millisecond
		lease     = 5 * heartbeat
		periods   = 24
	)
	scaled := func(c *Config) {
		c.Mode = ModeBinlog
		c.HeartbeatInterval, c.LeaderLease = heartbeat, lease
		c.CheckpointInterval = 0 // the default
		m, err := metrics.New(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		c.Metrics = m
	}
	startRelay(t, db, b, scaled)
	questions := func() int { return serverQuestions(ctx, t, db.SQL) }
	// count returns the statements the relays sent over periods heartbeat
	// intervals. The wait is the measurement's window, not a condition.
	count := func() int {
		before := questions()
		time.Sleep(periods * heartbeat)
		return questions() - before - 1 // the second SHOW counts itself
	}
	// Past the start: the first-start sweep, the first retention figure.
	time.Sleep(4 * heartbeat)
	if n := count(); n > periods+1 {
		t.Errorf("an idle leader sent %d statements in %d heartbeat intervals, want at most one per interval", n, periods)
	} else {
		t.Logf("idle leader: %d statements in %d heartbeat intervals", n, periods)
	}

	// A standby: its first look and its row in outbox_relay_instances, then
	// the window.
	cfg := Config{
		MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, ServerID: testenv.ServerID(t),
		Logger: zaptest.NewLogger(t).Named("standby"), Instance: "standby", RelayName: relayNameFor(db.Name),
	}
	scaled(&cfg)
	standby, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- standby.Run(sctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("standby: %v", err)
		}
		standby.Close()
	})
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox_relay_instances WHERE instance = 'standby'", 1)
	if n := count(); n > periods+periods/2+2 {
		t.Errorf("an idle leader and a standby sent %d statements in %d heartbeat intervals, want at most %d (one per interval, the standby one per two)",
			n, periods, periods+periods/2+2)
	} else {
		t.Logf("idle leader and a standby: %d statements in %d heartbeat intervals", n, periods)
	}
}

// serverQuestions is the server's Questions status: the statements it has
// received (this SHOW counts itself).
func serverQuestions(ctx context.Context, t *testing.T, db *sql.DB) int {
	t.Helper()
	var name string
	var n int
	if err := db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}
