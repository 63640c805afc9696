package canal

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/position"
)

// tableIDs is the truth: the ids in the outbox table, in order.
func tableIDs(t testing.TB, db *sql.DB) []uint64 {
	t.Helper()
	rows, err := db.QueryContext(testCtx(t), "SELECT id FROM outbox ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []uint64
	for rows.Next() {
		var id uint64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// checkExactlyOnce compares what c received with the table: every row once,
// in id order (one writer, so id order is commit order).
func checkExactlyOnce(t testing.TB, c *collector, want []uint64) {
	t.Helper()
	got, txns := c.snapshot()
	if c.err != nil {
		t.Fatal(c.err)
	}
	ids := make([]uint64, len(got))
	for i, r := range got {
		ids[i] = r.ID
	}
	if !equalU64(ids, want) {
		seen := map[uint64]int{}
		for _, id := range ids {
			seen[id]++
		}
		dups, missing := 0, 0
		for _, id := range want {
			switch seen[id] {
			case 0:
				missing++
			case 1:
			default:
				dups++
			}
		}
		t.Fatalf("got %d rows, want %d: %d duplicated, %d missing, order differs: got %v want %v",
			len(ids), len(want), dups, missing, short(ids), short(want))
	}
	if n := sumRows(txns); n != len(want) {
		t.Fatalf("Commit row counts sum to %d, want %d", n, len(want))
	}
}

// TestKillServerMidStream kills the server with SIGKILL while transactions
// stream and starts it again: Run reconnects by itself and the handler sees
// every committed row exactly once, in order.
func TestKillServerMidStream(t *testing.T) {
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	setupOutbox(t, db)
	start := currentPosition(t, db.SQL)

	cfg := tailerConfig(t, db)
	var retries atomic.Int32
	cfg.OnRetry = func(error, int) { retries.Add(1) }
	tl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The kill happens while Row holds the second (or later) row of a
	// transaction, so the stream breaks in the middle of one.
	kill, killed := make(chan struct{}), make(chan struct{})
	var fired atomic.Bool
	c := &collector{onRow: func(n, cur int) {
		if n >= 1500 && cur >= 2 && fired.CompareAndSwap(false, true) {
			close(kill)
			<-killed
		}
	}}
	r := startRun(t, tl, start, c)

	// The writer commits transactions of 1 to 300 rows until told to stop;
	// a transaction cut by the kill may or may not have committed, so the
	// table, not the writer, is the truth.
	stop := make(chan struct{})
	written := make(chan struct{})
	var writeErrs, commits atomic.Int32
	go func() {
		defer close(written)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := insertRecords(ctx, db.SQL, newRecords(1+mrand.N(300))); err != nil {
				if writeErrs.Add(1) == 1 {
					t.Logf("writer (expected around the kill): %v", err)
				}
				// A pause before the next attempt while the server is
				// down, not a wait for a condition.
				time.Sleep(50 * time.Millisecond)
			} else {
				commits.Add(1)
			}
			cancel()
		}
	}()

	select {
	case <-kill:
	case <-time.After(60 * time.Second):
		t.Fatal("no rows streamed")
	}
	srv.Kill(t)
	close(killed)
	// The outage itself: the server stays down a moment, so the tailer's
	// reconnects are refused before one succeeds.
	time.Sleep(200 * time.Millisecond)
	srv.Start(t)
	// More transactions after the restart, streamed by the reconnected tailer.
	for after := commits.Load() + 5; commits.Load() < after; {
		select {
		case <-written:
			t.Fatal("the writer stopped")
		case <-time.After(10 * time.Millisecond):
		}
	}
	close(stop)
	<-written

	end := currentPosition(t, db.SQL)
	waitCovered(t, r, c, end, 60*time.Second)
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkExactlyOnce(t, c, tableIDs(t, db.SQL))
	if retries.Load() == 0 {
		t.Fatal("no reconnect happened")
	}
	got, _ := c.snapshot()
	t.Logf("%d rows exactly once across the kill, %d reconnect attempts, %d failed writes", len(got), retries.Load(), writeErrs.Load())
}

// proxiedTailerConfig is tailerConfig reaching db through a fault proxy.
func proxiedTailerConfig(t *testing.T, db *testenv.DB) (*testenv.FaultProxy, Config) {
	t.Helper()
	p := testenv.Proxy(t, net.JoinHostPort(db.Host, strconv.Itoa(db.Port)))
	cfg := tailerConfig(t, db)
	host, port, err := net.SplitHostPort(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host = host
	if cfg.Port, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	return p, cfg
}

// TestProxyCutMidTransaction cuts the connection twice while a 5,000-row
// transaction streams (once with a reset, once refusing reconnects for a
// while): no row is duplicated or lost and the transaction's Commit counts
// all 5,000.
func TestProxyCutMidTransaction(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	ctx := testCtx(t)
	p, cfg := proxiedTailerConfig(t, db)
	var retries atomic.Int32
	cfg.OnRetry = func(error, int) { retries.Add(1) }
	tl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := currentPosition(t, db.SQL)
	c := &collector{onRow: func(n, cur int) {
		switch n {
		case 1000:
			p.Cut()
		case 3000:
			p.Disable()
			time.AfterFunc(300*time.Millisecond, p.Enable)
		}
	}}
	r := startRun(t, tl, start, c)

	recs := newRecords(5000)
	for _, rec := range recs {
		rec.Payload = bytes.Repeat([]byte{0, 'x'}, 512) // ~5 MB: many events, the cuts land inside
	}
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(recs); i += 500 {
		if err := insertRecords(ctx, tx, recs[i:i+500]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := insertRecords(ctx, db.SQL, newRecords(3)); err != nil {
		t.Fatal(err)
	}

	waitCovered(t, r, c, currentPosition(t, db.SQL), 60*time.Second)
	// The rows may all have been read (buffered by the syncer) before the
	// second fault ended the connection: the reconnect it forces comes
	// after them. Wait for it before stopping, as a proof that both faults
	// landed.
	sctx, cancel := progress.Step(ctx)
	defer cancel()
	for retries.Load() < 2 && sctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkExactlyOnce(t, c, tableIDs(t, db.SQL))
	_, txns := c.snapshot()
	var counts []int
	for _, tx := range txns {
		if tx.rows > 0 {
			counts = append(counts, tx.rows)
		}
	}
	if !equalInts(counts, []int{5000, 3}) {
		t.Fatalf("rows per transaction %v, want [5000 3]", counts)
	}
	if retries.Load() < 2 {
		t.Fatalf("%d reconnects, want at least 2", retries.Load())
	}
	t.Logf("5,003 rows exactly once through 2 faults, %d reconnect attempts", retries.Load())
}

// TestPurgedPosition: a position whose binlogs were purged is reported by
// CheckPosition and makes Run return *PurgedError (not retry forever).
func TestPurgedPosition(t *testing.T) {
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	setupOutbox(t, db)
	ctx := testCtx(t)
	old := currentPosition(t, db.SQL)
	if err := CheckPosition(ctx, db.SQL, old); err != nil {
		t.Fatalf("CheckPosition before the purge: %v", err)
	}
	var oldFile string
	if err := db.SQL.QueryRowContext(ctx, "SHOW BINARY LOGS").Scan(&oldFile, new(any)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := insertRecords(ctx, db.SQL, newRecords(2)); err != nil {
			t.Fatal(err)
		}
	}
	srv.PurgeBinlogs(t)
	cur := currentPosition(t, db.SQL)

	var pe *PurgedError
	if err := CheckPosition(ctx, db.SQL, old); !errors.As(err, &pe) {
		t.Fatalf("CheckPosition(%s) after the purge = %v, want *PurgedError", old, err)
	} else {
		t.Log(err)
	}
	if err := CheckPosition(ctx, db.SQL, position.Position{Flavor: FlavorMariaDB, File: oldFile, Pos: 4}); !errors.As(err, &pe) {
		t.Fatalf("CheckPosition(file %s) = %v, want *PurgedError", oldFile, err)
	}
	if err := CheckPosition(ctx, db.SQL, cur); err != nil {
		t.Fatalf("CheckPosition(current %s) = %v", cur, err)
	}
	ahead := position.Position{Flavor: FlavorMariaDB, GTIDSet: fmt.Sprintf("0-%d-999999", srv.ServerID())}
	if err := CheckPosition(ctx, db.SQL, ahead); !errors.As(err, &pe) {
		t.Fatalf("CheckPosition(%s) = %v, want *PurgedError (diverged)", ahead, err)
	}

	tl, err := New(tailerConfig(t, db))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = tl.Run(runCtx, old, &collector{})
	if !errors.As(err, &pe) || pe.Position.GTIDSet != old.GTIDSet {
		t.Fatalf("Run from a purged position = %v, want *PurgedError", err)
	}
	t.Log(err)
}

// TestBlockingHandler: a Row that blocks longer than ReadTimeout (back-pressure
// from a full in-flight window) costs a reconnect at most, never a duplicate
// or a gap.
func TestBlockingHandler(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	ctx := testCtx(t)
	cfg := tailerConfig(t, db)
	cfg.HeartbeatPeriod, cfg.ReadTimeout = 200*time.Millisecond, time.Second
	var retries atomic.Int32
	cfg.OnRetry = func(error, int) { retries.Add(1) }
	tl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{onRow: func(n, cur int) {
		if n == 300 {
			// The stimulus: a handler blocked longer than ReadTimeout.
			time.Sleep(2500 * time.Millisecond)
		}
	}}
	r := startRun(t, tl, currentPosition(t, db.SQL), c)
	for range 4 {
		recs := newRecords(500)
		for _, rec := range recs {
			rec.Payload = make([]byte, 1024)
		}
		if err := insertRecords(ctx, db.SQL, recs); err != nil {
			t.Fatal(err)
		}
	}
	waitCovered(t, r, c, currentPosition(t, db.SQL), 60*time.Second)
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkExactlyOnce(t, c, tableIDs(t, db.SQL))
	t.Logf("2,000 rows exactly once; %d reconnects caused by the blocked handler", retries.Load())
}
