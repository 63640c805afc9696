package migrations_test

import (
	"context"
	"database/sql"
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// A progress table from before 0005 (no mode_reason, a row in it) gets the
// column on the next migrate, NULL, and keeps its row; running migrate
// again does nothing.
func TestApplyAddsModeReason(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := olderSchema(ctx, t,
		"ALTER TABLE outbox_relay_progress DROP COLUMN mode_reason",
		"DELETE FROM outbox_relay_migrations WHERE version LIKE '0005%'",
		"INSERT INTO outbox_relay_progress (relay_name, gtid_set, mode, epoch, last_error) VALUES ('r', '0-1-7', 'poll', 3, 'boom')",
	)
	applied, err := migrations.Apply(ctx, db, migrations.Options{})
	if want := []string{"0005_progress_mode_reason"}; err != nil || !slices.Equal(applied, want) {
		t.Fatalf("applied %v, %v; want %v", applied, err, want)
	}
	var (
		gtid, mode, lastErr string
		epoch               int64
		reason              sql.NullString
	)
	if err := db.QueryRowContext(ctx, `SELECT gtid_set, mode, epoch, last_error, mode_reason
		FROM outbox_relay_progress WHERE relay_name = 'r'`).Scan(&gtid, &mode, &epoch, &lastErr, &reason); err != nil {
		t.Fatal(err)
	}
	if gtid != "0-1-7" || mode != "poll" || epoch != 3 || lastErr != "boom" || reason.Valid {
		t.Fatalf("row after migrate: %q %q %d %q %v", gtid, mode, epoch, lastErr, reason)
	}
	if applied, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil || len(applied) != 0 {
		t.Fatalf("third migrate applied %v, %v", applied, err)
	}
}

// A progress table from before 0007 (no failed_at, a row in it) gets the
// column on the next migrate, NULL, and keeps its row.
func TestApplyAddsFailedAt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := olderSchema(ctx, t,
		"ALTER TABLE outbox_relay_progress DROP COLUMN failed_at",
		"DELETE FROM outbox_relay_migrations WHERE version LIKE '0007%'",
		"INSERT INTO outbox_relay_progress (relay_name, gtid_set, epoch) VALUES ('r', '0-1-7', 3)",
	)
	if err := migrations.Current(ctx, db, ""); err == nil {
		t.Fatal("Current accepts a progress table without failed_at")
	}
	applied, err := migrations.Apply(ctx, db, migrations.Options{})
	if want := []string{"0007_progress_failed_at"}; err != nil || !slices.Equal(applied, want) {
		t.Fatalf("applied %v, %v; want %v", applied, err, want)
	}
	var (
		gtid     string
		failedAt sql.NullTime
	)
	if err := db.QueryRowContext(ctx, "SELECT gtid_set, failed_at FROM outbox_relay_progress WHERE relay_name = 'r'").
		Scan(&gtid, &failedAt); err != nil {
		t.Fatal(err)
	}
	if gtid != "0-1-7" || failedAt.Valid {
		t.Fatalf("row after migrate: %q %v", gtid, failedAt)
	}
}

// A progress table from before 0008 (no broker, no confirms_stalled_at, a
// row in it) gets both on the next migrate, NULL, and keeps its row;
// running migrate again does nothing.
func TestApplyAddsBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := olderSchema(ctx, t,
		"ALTER TABLE outbox_relay_progress DROP COLUMN confirms_stalled_at, DROP COLUMN broker",
		"DELETE FROM outbox_relay_migrations WHERE version LIKE '0008%'",
		"INSERT INTO outbox_relay_progress (relay_name, gtid_set, epoch) VALUES ('r', '0-1-7', 3)",
	)
	if err := migrations.Current(ctx, db, ""); err == nil {
		t.Fatal("Current accepts a progress table without broker")
	}
	applied, err := migrations.Apply(ctx, db, migrations.Options{})
	if want := []string{"0008_progress_broker"}; err != nil || !slices.Equal(applied, want) {
		t.Fatalf("applied %v, %v; want %v", applied, err, want)
	}
	var (
		gtid    string
		broker  sql.NullString
		stalled sql.NullTime
	)
	if err := db.QueryRowContext(ctx, "SELECT gtid_set, broker, confirms_stalled_at FROM outbox_relay_progress WHERE relay_name = 'r'").
		Scan(&gtid, &broker, &stalled); err != nil {
		t.Fatal(err)
	}
	if gtid != "0-1-7" || broker.Valid || stalled.Valid {
		t.Fatalf("row after migrate: %q %v %v", gtid, broker, stalled)
	}
	if applied, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil || len(applied) != 0 {
		t.Fatalf("second migrate applied %v, %v", applied, err)
	}
}

// A progress table from before 0009 (no outbox_table, leader_lease_ms or
// leader_conn_id, a row in it) gets them on the next migrate, NULL, and keeps its row;
// running migrate again does nothing.
func TestApplyAddsOutboxTable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := olderSchema(ctx, t,
		"ALTER TABLE outbox_relay_progress DROP COLUMN leader_conn_id, DROP COLUMN leader_lease_ms, DROP COLUMN outbox_table",
		"DELETE FROM outbox_relay_migrations WHERE version LIKE '0009%'",
		"INSERT INTO outbox_relay_progress (relay_name, gtid_set, epoch) VALUES ('r', '0-1-7', 3)",
	)
	if err := migrations.Current(ctx, db, ""); err == nil {
		t.Fatal("Current accepts a progress table without outbox_table")
	}
	applied, err := migrations.Apply(ctx, db, migrations.Options{})
	if want := []string{"0009_progress_outbox_table"}; err != nil || !slices.Equal(applied, want) {
		t.Fatalf("applied %v, %v; want %v", applied, err, want)
	}
	var (
		gtid  string
		table sql.NullString
		lease sql.NullInt64
		conn  sql.NullInt64
	)
	if err := db.QueryRowContext(ctx, "SELECT gtid_set, outbox_table, leader_lease_ms, leader_conn_id FROM outbox_relay_progress WHERE relay_name = 'r'").
		Scan(&gtid, &table, &lease, &conn); err != nil {
		t.Fatal(err)
	}
	if gtid != "0-1-7" || table.Valid || lease.Valid || conn.Valid {
		t.Fatalf("row after migrate: %q %v %v %v", gtid, table, lease, conn)
	}
	if applied, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil || len(applied) != 0 {
		t.Fatalf("second migrate applied %v, %v", applied, err)
	}
}

// A progress table from before 0010 (no stream_ids, a row in it) gets it on
// the next migrate, NULL, and keeps its row; running migrate again does
// nothing.
func TestApplyAddsStreamIDs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := olderSchema(ctx, t,
		"ALTER TABLE outbox_relay_progress DROP COLUMN stream_ids",
		"DELETE FROM outbox_relay_migrations WHERE version LIKE '0010%'",
		"INSERT INTO outbox_relay_progress (relay_name, gtid_set, epoch) VALUES ('r', '0-1-7', 3)",
	)
	if err := migrations.Current(ctx, db, ""); err == nil {
		t.Fatal("Current accepts a progress table without stream_ids")
	}
	applied, err := migrations.Apply(ctx, db, migrations.Options{})
	if want := []string{"0010_progress_stream_ids"}; err != nil || !slices.Equal(applied, want) {
		t.Fatalf("applied %v, %v; want %v", applied, err, want)
	}
	var (
		gtid string
		ids  sql.NullString
	)
	if err := db.QueryRowContext(ctx, "SELECT gtid_set, stream_ids FROM outbox_relay_progress WHERE relay_name = 'r'").
		Scan(&gtid, &ids); err != nil {
		t.Fatal(err)
	}
	if gtid != "0-1-7" || ids.Valid {
		t.Fatalf("row after migrate: %q %v", gtid, ids)
	}
	if applied, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil || len(applied) != 0 {
		t.Fatalf("second migrate applied %v, %v", applied, err)
	}
}

// olderSchema migrates a fresh database, then runs queries on it (which
// take it back to an earlier shape), and returns it.
func olderSchema(ctx context.Context, t *testing.T, queries ...string) *sql.DB {
	t.Helper()
	db := testenv.MySQL(t).SQL
	if _, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, q := range queries {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return db
}
