package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// oldDedupTable is message_deduplication as 0001_relay_tables created it
// before the consumer column.
const oldDedupTable = `CREATE TABLE message_deduplication (
    message_id   BINARY(16)   NOT NULL,
    message_name VARCHAR(255) NOT NULL DEFAULT '',
    processed_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (message_id),
    KEY idx_processed_at (processed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`

var (
	wantDedupColumns = []string{"consumer varchar(255)", "message_id binary(16)", "message_name varchar(255)", "processed_at datetime(6)"}
	wantAttempts     = []string{"consumer varchar(255)", "message_id binary(16)", "attempts int(10) unsigned",
		"last_error varchar(1024)", "updated_at datetime(6)"}
)

// dedupRow is one message_deduplication row.
type dedupRow struct {
	consumer, id, name, at string
}

// dedupRows returns the rows of message_deduplication; consumer is "" for
// all of them when the table has no such column (withConsumer false).
func dedupRows(t *testing.T, db *sql.DB, withConsumer bool) []dedupRow {
	t.Helper()
	consumer := "''"
	if withConsumer {
		consumer = "consumer"
	}
	rows, err := db.Query(`SELECT ` + consumer + `, HEX(message_id), message_name, processed_at FROM message_deduplication ORDER BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []dedupRow
	for rows.Next() {
		var r dedupRow
		if err := rows.Scan(&r.consumer, &r.id, &r.name, &r.at); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// index returns the columns of a table's index, in order, joined by ",".
func index(t *testing.T, db *sql.DB, table, name string) string {
	t.Helper()
	var cols sql.NullString
	if err := db.QueryRow(`SELECT GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) FROM information_schema.STATISTICS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME = ?`, table, name).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	return cols.String
}

// checkDedupShape asserts the inbox tables' upgraded shape.
func checkDedupShape(t *testing.T, db *sql.DB) {
	t.Helper()
	if got := columns(t, db, "message_deduplication"); !reflect.DeepEqual(got, wantDedupColumns) {
		t.Fatalf("message_deduplication columns\n got %v\nwant %v", got, wantDedupColumns)
	}
	if pk := index(t, db, "message_deduplication", "PRIMARY"); pk != "consumer,message_id" {
		t.Fatalf("message_deduplication primary key (%s), want (consumer,message_id)", pk)
	}
	if ix := index(t, db, "message_deduplication", "idx_processed_at"); ix != "processed_at" {
		t.Fatalf("message_deduplication idx_processed_at on (%s), want (processed_at)", ix)
	}
	var collation string
	if err := db.QueryRow(`SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
		AND TABLE_NAME = 'message_deduplication' AND COLUMN_NAME = 'consumer'`).Scan(&collation); err != nil || collation != "utf8mb4_bin" {
		t.Fatalf("consumer collation %q, %v; want utf8mb4_bin", collation, err)
	}
	if got := columns(t, db, "message_inbox_attempts"); !reflect.DeepEqual(got, wantAttempts) {
		t.Fatalf("message_inbox_attempts columns\n got %v\nwant %v", got, wantAttempts)
	}
	if pk := index(t, db, "message_inbox_attempts", "PRIMARY"); pk != "consumer,message_id" {
		t.Fatalf("message_inbox_attempts primary key (%s), want (consumer,message_id)", pk)
	}
}

// A database migrated by a version before 0004 (message_deduplication keyed
// by message_id alone, with rows in it) is upgraded by the next migrate:
// every row stays, with consumer ”, the key becomes (consumer, message_id),
// and the attempts table appears. A third migrate does nothing.
func TestApplyUpgradesDedupTable(t *testing.T) {
	db := testenv.MySQL(t).SQL
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	// Back to the shape and records of the earlier version.
	for _, q := range []string{
		"DROP TABLE IF EXISTS message_inbox_attempts",
		"DROP TABLE message_deduplication",
		oldDedupTable,
		"DELETE FROM outbox_relay_migrations WHERE version LIKE '0004%'",
		`INSERT INTO message_deduplication (message_id, message_name, processed_at) VALUES
			(UNHEX('0190f0e0a1b27c3d8e4f5a6b7c8d9e01'), 'order.placed', '2026-01-02 03:04:05.123456'),
			(UNHEX('0190f0e0a1b27c3d8e4f5a6b7c8d9e02'), 'order.paid', '2026-01-02 03:04:06.000001'),
			(UNHEX('0190f0e0a1b27c3d8e4f5a6b7c8d9e00'), '', '2025-12-31 23:59:59.999999')`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	before := dedupRows(t, db, false)

	applied, err := migrations.Apply(ctx, db, migrations.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0004_dedup_consumer"}; !slices.Equal(applied, want) {
		t.Fatalf("applied %v, want %v", applied, want)
	}
	checkDedupShape(t, db)
	after := dedupRows(t, db, true)
	if len(after) != len(before) {
		t.Fatalf("%d rows after the upgrade, %d before", len(after), len(before))
	}
	if !slices.Equal(after, before) {
		t.Fatalf("rows after the upgrade\n%+v\nbefore (consumer '' expected)\n%+v", after, before)
	}

	// Consumers keep apart: the same message for another consumer is a new
	// row, for the same consumer a duplicate key.
	if _, err := db.ExecContext(ctx, `INSERT INTO message_deduplication (consumer, message_id, message_name, processed_at)
		VALUES ('billing', UNHEX('0190f0e0a1b27c3d8e4f5a6b7c8d9e01'), 'order.placed', UTC_TIMESTAMP(6))`); err != nil {
		t.Fatalf("same message, other consumer: %v", err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO message_deduplication (consumer, message_id, message_name, processed_at)
		VALUES ('', UNHEX('0190f0e0a1b27c3d8e4f5a6b7c8d9e01'), 'order.placed', UTC_TIMESTAMP(6))`); err == nil {
		t.Fatal("same consumer and message accepted twice")
	}

	if applied, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil || len(applied) != 0 {
		t.Fatalf("migrate again: applied %v, %v; want nothing", applied, err)
	}
}

// A database holding only an old message_deduplication (say, an inbox made
// before the relay's tables) is adopted: the shape check accepts the
// missing consumer column, which migrate adds.
func TestApplyAdoptsOldDedupTable(t *testing.T) {
	db := testenv.MySQL(t).SQL
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, q := range []string{oldDedupTable,
		"INSERT INTO message_deduplication (message_id, message_name) VALUES (UNHEX(REPEAT('ab', 16)), 'x')"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	applied, err := migrations.Apply(ctx, db, migrations.Options{})
	if want := []string{"0001_relay_tables", "0001_outbox:outbox", "0004_dedup_consumer", "0005_progress_mode_reason", "0006_pause_and_instances", "0007_progress_failed_at", "0008_progress_broker", "0009_progress_outbox_table", "0010_progress_stream_ids", "0011_stream_consumer_offsets"}; err != nil || !slices.Equal(applied, want) {
		t.Fatalf("applied %v, %v; want %v", applied, err, want)
	}
	checkDedupShape(t, db)
	if rows := dedupRows(t, db, true); len(rows) != 1 || rows[0].consumer != "" || rows[0].name != "x" {
		t.Fatalf("rows after migrate: %+v", rows)
	}
}

// 0004 runs again when the attempts table is gone, and running it on an
// inbox already upgraded changes nothing there; on an inbox with the column
// but the old key, it fixes the key.
func TestApplyRecreatesAttemptsTable(t *testing.T) {
	db := testenv.MySQL(t).SQL
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"INSERT INTO message_deduplication (consumer, message_id, message_name, processed_at) VALUES ('c', UNHEX(REPEAT('cd', 16)), 'y', UTC_TIMESTAMP(6))",
		"DROP TABLE message_inbox_attempts",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	applied, err := migrations.Apply(ctx, db, migrations.Options{})
	if want := []string{"0004_dedup_consumer"}; err != nil || !slices.Equal(applied, want) {
		t.Fatalf("applied %v, %v; want %v", applied, err, want)
	}
	checkDedupShape(t, db)
	if rows := dedupRows(t, db, true); len(rows) != 1 || rows[0].consumer != "c" {
		t.Fatalf("rows after migrate: %+v", rows)
	}

	// A consumer column under the old key (an upgrade done by hand half
	// way) gets the key.
	for _, q := range []string{
		"ALTER TABLE message_deduplication DROP PRIMARY KEY, ADD PRIMARY KEY (message_id)",
		"DROP TABLE message_inbox_attempts",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if applied, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil || len(applied) != 1 {
		t.Fatalf("applied %v, %v; want 0004 alone", applied, err)
	}
	checkDedupShape(t, db)
	if rows := dedupRows(t, db, true); len(rows) != 1 || rows[0].consumer != "c" {
		t.Fatalf("rows after migrate: %+v", rows)
	}
}

// An attempts table of another shape is refused like any other table, and
// nothing is created.
func TestApplyRefusesOtherAttemptsTable(t *testing.T) {
	db := testenv.MySQL(t).SQL
	if _, err := db.Exec("CREATE TABLE message_inbox_attempts (consumer VARCHAR(255) NOT NULL, message_id CHAR(36) NOT NULL, PRIMARY KEY (consumer, message_id))"); err != nil {
		t.Fatal(err)
	}
	applied, err := migrations.Apply(context.Background(), db, migrations.Options{})
	want := `table "message_inbox_attempts": column "message_id" is char(36), want binary(16)`
	if !errors.Is(err, migrations.ErrSchemaMismatch) || err.Error() != want || applied != nil {
		t.Fatalf("applied %v, err %v\nwant %s", applied, err, want)
	}
}
