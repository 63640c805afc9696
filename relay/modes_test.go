package relay

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// modes records the modes a relay entered, in order.
type modes struct {
	mu   sync.Mutex
	seen []Mode
	ch   chan Mode
}

func newModes() *modes { return &modes{ch: make(chan Mode, 100)} }

func (m *modes) hook(mode Mode, reason string) {
	m.mu.Lock()
	m.seen = append(m.seen, mode)
	m.mu.Unlock()
	m.ch <- mode
}

// wait waits until the relay enters mode.
func (m *modes) wait(ctx context.Context, t *testing.T, mode Mode) {
	t.Helper()
	for {
		select {
		case got := <-m.ch:
			if got == mode {
				return
			}
		case <-ctx.Done():
			m.mu.Lock()
			defer m.mu.Unlock()
			t.Fatalf("relay never entered %s mode (modes so far: %v)", mode, m.seen)
		}
	}
}

// --mode poll alone: every message exactly once, in commit order per
// partition, with four workers; and the same with --on-delivered=mark.
func TestPollModeDeliversExactlyOnceInOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mark  bool
		total int
	}{{false, 6_000}, {true, 2_000}} {
		t.Run(fmt.Sprintf("mark=%v", tc.mark), func(t *testing.T) {
			db, b := setup(t)
			v := consume(t, b, b.Queue)
			startRelay(t, db, b, func(c *Config) {
				c.Mode, c.PollWorkers = ModePoll, 4
				if tc.mark {
					c.OnDelivered = "mark"
				}
			})
			ctx := testenv.WorkContext(t)
			produce(ctx, t, db, b, v, load{producers: 8, partitions: 200, total: tc.total, bigTxn: 500, bigShare: 0.5})
			if err := v.WaitComplete(ctx); err != nil {
				t.Fatal(err)
			}
			if err := v.Check(validator.ExactlyOnce); err != nil {
				t.Fatal(err)
			}
			if tc.mark {
				waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL", 0)
			} else {
				waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
			}
		})
	}
}

// First start on a table that already holds 10,000 pending rows while
// producers keep writing: nothing lost, nothing sent twice, commit order per
// partition. The first start runs the poll → binlog handover.
func TestFirstStartWithBacklogAndLiveProducers(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	v := consume(t, b, b.Queue)
	ctx := testenv.WorkContext(t)
	// Partitions 0-99 for the backlog writers, 100-199 for the live ones:
	// each partition has one writer, so its commit order is known.
	produce(ctx, t, db, b, v, load{producers: 4, partitions: 100, total: 4_000, bigTxn: 500, bigShare: 0.7})
	live := make(chan error, 1)
	go func() {
		live <- testload.Run(ctx, db.SQL, v, testload.Load{Producers: 4, Partitions: 100, Total: 4_000,
			BigTxn: 50, BigShare: 0.3, Exchange: b.Exchange, PartitionOffset: 100})
	}()
	startRelay(t, db, b, nil)
	if err := <-live; err != nil {
		t.Fatal(err)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
}

// Relay stopped, 6,000 rows written, binlogs flushed and purged past the
// checkpoint, relay started: it polls, catches up, returns to binlog mode,
// and nothing is lost.
func TestPurgedCheckpointPollsThenReturnsToBinlog(t *testing.T) {
	t.Parallel()
	srv, db, b := privateSetup(t)
	v := consume(t, b, b.Queue)
	ctx := testenv.WorkContext(t)
	stop := startRelay(t, db, b, nil)
	produce(ctx, t, db, b, v, load{producers: 2, partitions: 20, total: 1_000, bigTxn: 100, bigShare: 0.5})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	produce(ctx, t, db, b, v, load{producers: 4, partitions: 100, total: 6_000, bigTxn: 500, bigShare: 0.7})
	srv.PurgeBinlogs(t)
	m := newModes()
	startRelay(t, db, b, func(c *Config) { c.OnMode, c.BinlogRetryInterval = m.hook, 500*time.Millisecond })
	m.wait(ctx, t, ModePoll)
	m.wait(ctx, t, ModeBinlog)
	produce(ctx, t, db, b, v, load{producers: 2, partitions: 20, total: 1_000, bigTxn: 100, bigShare: 0.5})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
}

// A server with the binlog off: auto mode polls and delivers.
func TestBinlogOffPolls(t *testing.T) {
	t.Parallel()
	srv := testenv.StartServer(t, testenv.ServerOptions{NoBinlog: true})
	db := srv.CreateDatabase(t)
	ctx := testenv.WorkContext(t)
	db.Migrate(ctx, t)
	b := testenv.RabbitMQ(t)
	v := consume(t, b, b.Queue)
	m := newModes()
	r, _ := startRelayR(t, db, b, func(c *Config) { c.OnMode = m.hook })
	if !r.Polling() {
		t.Fatal("relay on a server without binlog is not polling")
	}
	produce(ctx, t, db, b, v, load{producers: 4, partitions: 40, total: 4_000, bigTxn: 100, bigShare: 0.5})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
}

// relayUser creates a user with what the relay needs and returns its DSN.
func relayUser(t *testing.T, root *sql.DB, srv *testenv.Server, dbName string) string {
	t.Helper()
	for _, q := range []string{
		"CREATE USER 'relay'@'127.0.0.1' IDENTIFIED BY 'relay-secret'",
		"GRANT ALL ON `" + dbName + "`.* TO 'relay'@'127.0.0.1'",
		"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'relay'@'127.0.0.1'",
	} {
		if _, err := root.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return fmt.Sprintf("relay:relay-secret@tcp(%s)/%s", srv.Addr(), dbName)
}

// revokeAndCut takes REPLICATION SLAVE away and ends the relay's binlog
// connection, which a revoke alone leaves running (global privileges of a
// session are fixed at login); the tailer's reconnect is then refused. It
// first waits for that connection to exist: the relay enters binlog mode
// before its tailer has logged in.
func revokeAndCut(ctx context.Context, t *testing.T, root *sql.DB) {
	t.Helper()
	dumps := func() []int64 {
		rows, err := root.QueryContext(ctx, "SELECT id FROM information_schema.PROCESSLIST WHERE user = 'relay' AND command LIKE 'Binlog Dump%'")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	if err := pollUntil(ctx, func() bool { return len(dumps()) > 0 }); err != nil {
		t.Fatalf("the relay's binlog connection never appeared: %v", err)
	}
	if _, err := root.ExecContext(ctx, "REVOKE REPLICATION SLAVE ON *.* FROM 'relay'@'127.0.0.1'"); err != nil {
		t.Fatal(err)
	}
	for _, id := range dumps() {
		if _, err := root.ExecContext(ctx, fmt.Sprintf("KILL %d", id)); err != nil && !strings.Contains(err.Error(), "Unknown thread") {
			t.Fatal(err)
		}
	}
}

// Under continuous load from 8 producers, REPLICATION SLAVE is revoked and
// granted again six times: each revoke makes the binlog reconnect fail with
// an access error, which sends the relay to poll mode at once (an error
// retrying cannot fix; --fallback-after is for trouble that might pass, and
// TestFallsBackWhenBinlogConnectionHangs tests it), and each grant brings it
// back to the binlog within the retry interval; nothing is lost and first
// deliveries keep commit order per partition.
func TestSwitchesUnderLoad(t *testing.T) {
	t.Parallel()
	srv, db, b := privateSetup(t)
	root := srv.Root(t)
	dsn := relayUser(t, root, srv, db.Name)
	v := consume(t, b, b.Queue)
	ctx := testenv.WorkContext(t)
	m := newModes()
	startRelay(t, db, b, func(c *Config) {
		c.MySQLDSN, c.OnMode = dsn, m.hook
		c.BinlogRetryInterval = 300 * time.Millisecond
	})
	m.wait(ctx, t, ModeBinlog)

	// A paced load, not one that lasts until the last switch: each return
	// to the binlog sweeps the pending rows until none is left, which
	// producers writing without end can outrun on a busy machine.
	loadDone := make(chan error, 1)
	go func() {
		loadDone <- testload.Run(ctx, db.SQL, v, testload.Load{Producers: 8, Partitions: 200, Total: 10_000,
			BigTxn: 50, BigShare: 0.1, Exchange: b.Exchange, Pace: 15 * time.Millisecond})
	}()
	const cycles = 6
	for i := 0; i < cycles; i++ {
		revokeAndCut(ctx, t, root)
		m.wait(ctx, t, ModePoll)
		if _, err := root.ExecContext(ctx, "GRANT REPLICATION SLAVE ON *.* TO 'relay'@'127.0.0.1'"); err != nil {
			t.Fatal(err)
		}
		m.wait(ctx, t, ModeBinlog)
	}
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d switches each way under load: %d deliveries, %d duplicates", cycles, v.Received(), v.Duplicates())
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
}
