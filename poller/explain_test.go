package poller

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// TestExplainPlans prints the EXPLAIN plan and the best-of-5 time of each
// statement of a round over a 200,000-row backlog (docs/poller.md shows
// the output). It is a measuring tool, not a check: it runs only with
// OUTBOX_POLLER_EXPLAIN=1, on MariaDB (it loads rows from the SEQUENCE
// engine).
func TestExplainPlans(t *testing.T) {
	if os.Getenv("OUTBOX_POLLER_EXPLAIN") != "1" {
		t.Skip("set OUTBOX_POLLER_EXPLAIN=1 to print the poller's query plans")
	}
	for _, shape := range []struct {
		name       string
		partitions int
		marked     bool // three rows in four already marked delivered
	}{
		{"1000-partitions", 1000, false},
		{"200000-partitions", 200_000, false},
		{"1000-partitions-mark-history", 1000, true},
	} {
		t.Run(shape.name, func(t *testing.T) {
			ctx := context.Background()
			tdb := testenv.MySQL(t)
			tdb.Migrate(ctx, t)
			db := tdb.SQL
			// One row in 97 has available_at set: half an hour ago or an
			// hour ahead.
			mustExec(t, db, fmt.Sprintf(`INSERT INTO outbox (message_id, partition_key, routing_key, payload, available_at)
				SELECT UNHEX(REPLACE(UUID(), '-', '')), CONCAT('p', seq %% %d), 'rk', REPEAT('x', 256),
				IF(seq %% 97 = 0, UTC_TIMESTAMP(6) + INTERVAL IF(seq %% 2 = 0, 60, -30) MINUTE, NULL)
				FROM seq_1_to_200000`, shape.partitions))
			if shape.marked {
				mustExec(t, db, "UPDATE outbox SET delivered_at = NOW(6) WHERE id % 4 <> 0")
			}
			mustExec(t, db, "ANALYZE TABLE outbox")
			q := queries{table: "`outbox`", mark: shape.marked}
			limit := DefaultBatch * (DefaultWorkers + 1)

			cq, _ := q.candidates("", nil, limit, 0)
			explain(t, db, "candidates", cq, nil)
			cands, err := readCandidates(ctx, db, cq)
			if err != nil {
				t.Fatal(err)
			}
			ids, next, _ := heads(cands, limit)
			t.Logf("%d candidate rows, %d ids to claim, next cursor %q", len(cands), len(ids), next)
			if next != "" {
				cq, args := q.candidates(next, nil, limit, 0)
				explain(t, db, "candidates from a cursor", cq, args)
			}
			explain(t, db, "claim", q.claim(ids[:min(len(ids), maxClaimIDs)], DefaultBatch), nil)

			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			hs, err := readRecords(ctx, tx, q.claim(ids[:min(len(ids), 250)], 250))
			_ = tx.Rollback()
			if err != nil {
				t.Fatal(err)
			}
			fq, fargs := q.followers(hs, DefaultBatch-len(hs), 0)
			explain(t, db, fmt.Sprintf("followers of %d heads", len(hs)), fq, fargs)
			// The statements checkpoint.Store.AckRows runs for a round.
			acked := ordering.RangesOf(ids[:min(len(ids), DefaultBatch)])
			explain(t, db, "ack (delete)", ackStatement(t, db, checkpoint.Delete, acked), nil)
			explain(t, db, "ack (mark)", ackStatement(t, db, checkpoint.Mark, acked), nil)
			explain(t, db, "the same head query on idx_partition_id",
				"SELECT id FROM outbox WHERE id IN (SELECT MIN(id) FROM outbox WHERE delivered_at IS NULL AND "+due+
					" AND partition_key <> '' GROUP BY partition_key) ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED", nil)
		})
	}
}

// ackStatement returns the statement checkpoint.Store.AckRows runs to
// acknowledge ids (fewer than its chunk size) in mode onDelivered, without
// running it.
func ackStatement(t *testing.T, db *sql.DB, onDelivered string, ids []ordering.Range) string {
	t.Helper()
	store, err := checkpoint.New(db, checkpoint.Config{OnDelivered: onDelivered})
	if err != nil {
		t.Fatal(err)
	}
	var rec recordExec
	if err := store.AckRows(context.Background(), &rec, ids, make([]outbox.MessageID, ordering.Count(ids)), nil); err != nil || len(rec.queries) != 1 {
		t.Fatalf("AckRows ran %d statements (%v), want 1", len(rec.queries), err)
	}
	return rec.queries[0]
}

// recordExec is a checkpoint.Execer that records statements instead of
// running them.
type recordExec struct{ queries []string }

func (r *recordExec) ExecContext(_ context.Context, query string, _ ...any) (sql.Result, error) {
	r.queries = append(r.queries, query)
	return driver.RowsAffected(0), nil
}

func mustExec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%.200s: %v", q, err)
	}
}

// explain logs the plan of query and, for a SELECT, its best time of five.
func explain(t *testing.T, db *sql.DB, name, query string, args []any) {
	t.Helper()
	rows, err := db.Query("EXPLAIN "+query, args...)
	if err != nil {
		t.Fatalf("explain %s: %v", name, err)
	}
	cols, _ := rows.Columns()
	var b strings.Builder
	fmt.Fprintf(&b, "%s:\n%s\n", name, strings.Join(cols, " | "))
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		s := make([]string, len(vals))
		for i, v := range vals {
			s[i] = v.String
		}
		fmt.Fprintf(&b, "%s\n", strings.Join(s, " | "))
	}
	rows.Close()
	if strings.HasPrefix(query, "SELECT") || strings.HasPrefix(query, "(SELECT") {
		var best time.Duration
		n := 0
		for i := range 5 {
			tx, err := db.Begin() // FOR UPDATE needs one; rolled back
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			rows, err := tx.Query(query, args...)
			if err != nil {
				t.Fatal(err)
			}
			n = 0
			for rows.Next() {
				n++
			}
			rows.Close()
			if d := time.Since(start); i == 0 || d < best {
				best = d
			}
			_ = tx.Rollback()
		}
		fmt.Fprintf(&b, "%d rows, best of 5: %v\n", n, best.Round(10*time.Microsecond))
	}
	t.Log(b.String())
}
