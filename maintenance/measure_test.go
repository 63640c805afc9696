package maintenance_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/maintenance"
)

// TestMeasureCleanupProducerLatency measures what a cleanup of delivered
// rows costs a producer that keeps committing meanwhile: one row per
// transaction at a steady rate, commit latency p50/p99/max before and
// during the cleanup. It is a measurement, not a check, and takes a few
// minutes, so it runs only with OUTBOX_MEASURE=1:
//
//	OUTBOX_MEASURE=1 OUTBOX_REQUIRE_INTEGRATION=1 go test -count=1 -v -timeout 20m \
//	    -run TestMeasureCleanupProducerLatency ./maintenance
//
// OUTBOX_MEASURE_ROWS sets the delivered rows (default 1,000,000). With
// OUTBOX_MEASURE_SINGLE=1 it also measures the same rows deleted by one
// DELETE statement, what the batches replace. docs/benchmarks.md has the
// figures.
func TestMeasureCleanupProducerLatency(t *testing.T) {
	if os.Getenv("OUTBOX_MEASURE") != "1" {
		t.Skip("a measurement: set OUTBOX_MEASURE=1 to run it")
	}
	rows := 1_000_000
	if s := os.Getenv("OUTBOX_MEASURE_ROWS"); s != "" {
		var err error
		if rows, err = strconv.Atoi(s); err != nil {
			t.Fatal(err)
		}
	}
	db := testenv.MySQL(t)
	ctx := testenv.WorkContext(t)
	db.Migrate(ctx, t)
	fill := func() {
		began := time.Now()
		for done := 0; done < rows; done += 100_000 {
			n := min(100_000, rows-done)
			if _, err := db.SQL.ExecContext(ctx, `INSERT INTO outbox (message_id, partition_key, routing_key, payload, created_at, delivered_at)
				SELECT UNHEX(REPLACE(UUID(), '-', '')), CONCAT('key-', seq % 1000), 'order.placed', REPEAT('x', 200),
				UTC_TIMESTAMP(6) - INTERVAL 10 DAY, UTC_TIMESTAMP(6) - INTERVAL 9 DAY FROM seq_1_to_`+strconv.Itoa(n)); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("inserted %d delivered rows in %v", rows, time.Since(began).Round(time.Millisecond))
	}
	fill()

	p := startProducer(ctx, t, db.SQL, 100)
	defer p.stop()
	time.Sleep(15 * time.Second) // the "before" window: a fixed span of producer commits is the sample
	before := p.take()

	began := time.Now()
	res, err := maintenance.CleanupDelivered(ctx, db.SQL, maintenance.CleanupOptions{OlderThan: 7 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	during := p.take()
	t.Logf("cleanup: %d rows in %d batches of %d, %v (%.0f rows/s)", res.Rows, res.Batches, maintenance.DefaultBatchSize,
		took.Round(time.Millisecond), float64(res.Rows)/took.Seconds())
	t.Logf("producer commit latency before: %s", summary(before))
	t.Logf("producer commit latency during: %s", summary(during))
	if res.Rows != int64(rows) {
		t.Fatalf("deleted %d rows, want %d", res.Rows, rows)
	}

	if os.Getenv("OUTBOX_MEASURE_SINGLE") != "1" {
		return
	}
	p.stop()
	fill()
	p = startProducer(ctx, t, db.SQL, 100)
	time.Sleep(15 * time.Second)
	before = p.take()
	began = time.Now()
	r, err := db.SQL.ExecContext(ctx, "DELETE FROM outbox WHERE delivered_at IS NOT NULL AND delivered_at < UTC_TIMESTAMP(6) - INTERVAL 7 DAY")
	if err != nil {
		t.Fatal(err)
	}
	took = time.Since(began)
	n, _ := r.RowsAffected()
	during = p.take()
	t.Logf("one DELETE statement (REPEATABLE READ, autocommit): %d rows, %v", n, took.Round(time.Millisecond))
	t.Logf("producer commit latency before: %s", summary(before))
	t.Logf("producer commit latency during: %s", summary(during))
}

// producer inserts one pending row per transaction at a steady rate and
// records each transaction's latency (BEGIN to COMMIT returned).
type producer struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	lats   []time.Duration
}

func startProducer(ctx context.Context, t *testing.T, db *sql.DB, perSecond int) *producer {
	ctx, cancel := context.WithCancel(ctx)
	p := &producer{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(time.Second / time.Duration(perSecond))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			id := newID(t)
			began := time.Now()
			tx, err := db.BeginTx(ctx, nil)
			if err == nil {
				if _, err = tx.ExecContext(ctx, "INSERT INTO outbox (message_id, partition_key, routing_key, payload) VALUES (?, 'live', 'order.placed', '{}')", id[:]); err == nil {
					err = tx.Commit()
				} else {
					_ = tx.Rollback()
				}
			}
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("producer: %v", err)
				}
				return
			}
			p.mu.Lock()
			p.lats = append(p.lats, time.Since(began))
			p.mu.Unlock()
		}
	}()
	return p
}

// take returns the latencies recorded since the last take.
func (p *producer) take() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.lats
	p.lats = nil
	return out
}

func (p *producer) stop() {
	p.cancel()
	<-p.done
}

func summary(lats []time.Duration) string {
	if len(lats) == 0 {
		return "no commits"
	}
	s := slices.Clone(lats)
	slices.Sort(s)
	q := func(f float64) time.Duration { return s[min(len(s)-1, int(f*float64(len(s))))] }
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
	return fmt.Sprintf("%d commits, p50 %s, p99 %s, max %s", len(s), ms(q(0.50)), ms(q(0.99)), ms(s[len(s)-1]))
}
