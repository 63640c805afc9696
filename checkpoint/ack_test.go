package checkpoint_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/ordering"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// AckRows must lock only the rows it acknowledges, also when the table's
// statistics say it is empty — a queue table's usual state, in which
// MariaDB plans "DELETE ... WHERE id IN (...)" as a full scan. Another
// transaction holds (and has deleted) the first 100 rows; acknowledging
// rows further on must neither wait for it nor deadlock with it.
func TestAckRowsLocksOnlyItsRowsWhenStatisticsSayEmpty(t *testing.T) {
	for _, mode := range []string{checkpoint.Delete, checkpoint.Mark} {
		t.Run(mode, func(t *testing.T) {
			ctx := testenv.Context(t, time.Minute)
			db := testenv.MySQL(t)
			db.Migrate(ctx, t)
			mustExec(ctx, t, db.SQL, "INSERT INTO outbox (message_id, routing_key, payload) "+
				"SELECT UNHEX(REPLACE(UUID(), '-', '')), 'rk', 'x' FROM seq_1_to_300")
			var lo uint64
			if err := db.SQL.QueryRowContext(ctx, "SELECT MIN(id) FROM outbox").Scan(&lo); err != nil {
				t.Fatal(err)
			}
			emptyStatistics(ctx, t, db)

			// The other transaction: a poll worker's round, rows claimed and
			// deleted, not yet committed.
			other, err := db.SQL.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Rollback()
			if _, err := other.ExecContext(ctx, fmt.Sprintf("DELETE FROM outbox WHERE id BETWEEN %d AND %d", lo, lo+99)); err != nil {
				t.Fatal(err)
			}

			store, err := checkpoint.New(db.SQL, checkpoint.Config{OnDelivered: mode})
			if err != nil {
				t.Fatal(err)
			}
			conn, err := db.SQL.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// A wait of more than a second is the defect this test is about.
			if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
				t.Fatal(err)
			}
			tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			// Rows on both sides of a gap, as a poll round's heads are.
			acked := []ordering.Range{{Lo: lo + 200, Hi: lo + 229}, {Lo: lo + 250, Hi: lo + 250}, {Lo: lo + 260, Hi: lo + 262}}
			if err := store.AckRows(ctx, tx, acked, messageIDsOf(ctx, t, db.SQL, acked), nil); err != nil {
				t.Fatalf("AckRows of rows no one else holds: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}

			var left int
			q := "SELECT COUNT(*) FROM outbox WHERE id BETWEEN ? AND ? AND delivered_at IS NULL"
			if err := db.SQL.QueryRowContext(ctx, q, lo+200, lo+299).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if want := 100 - ordering.Count(acked); left != want {
				t.Fatalf("%d of rows %d..%d still pending after acknowledging %d of them; want %d", left, lo+200, lo+299, ordering.Count(acked), want)
			}
		})
	}
}

// emptyStatistics makes the optimizer believe the outbox is empty: stored
// statistics of zero rows, reloaded by renaming the table there and back.
func emptyStatistics(ctx context.Context, t *testing.T, db *testenv.DB) {
	t.Helper()
	mustExec(ctx, t, db.SQL, "ALTER TABLE outbox STATS_PERSISTENT = 1, STATS_AUTO_RECALC = 0")
	mustExec(ctx, t, db.SQL, "ANALYZE TABLE outbox")
	mustExec(ctx, t, db.SQL, "UPDATE mysql.innodb_table_stats SET n_rows = 0 WHERE database_name = DATABASE() AND table_name = 'outbox'")
	mustExec(ctx, t, db.SQL, "RENAME TABLE outbox TO outbox_stats_reload, outbox_stats_reload TO outbox")
	var estimate int64
	if err := db.SQL.QueryRowContext(ctx, "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox'").Scan(&estimate); err != nil {
		t.Fatal(err)
	}
	if estimate > 1 {
		t.Fatalf("the server still estimates %d rows: the test needs it to believe the table is empty", estimate)
	}
}

func mustExec(ctx context.Context, t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.ExecContext(ctx, q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}
