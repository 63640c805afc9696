package migrations_test

import (
	"context"
	"database/sql"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// insertLocal inserts one row the way a producer whose session runs in
// time_zone '+05:00' does, leaving created_at to the column default, and
// returns that created_at as stored and the server's UTC time around the
// insert.
func insertLocal(ctx context.Context, t *testing.T, db *sql.DB, table string) (created, before, after time.Time) {
	t.Helper()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A pooled connection must not go back with a foreign time zone.
	defer conn.ExecContext(context.WithoutCancel(ctx), "SET time_zone = DEFAULT")
	var b, c, a string
	steps := []struct {
		q    string
		dest *string
	}{
		{"SET time_zone = '+05:00'", nil},
		{"SELECT UTC_TIMESTAMP(6)", &b},
		{"INSERT INTO " + table + " (message_id, routing_key, payload) VALUES (UNHEX(REPLACE(UUID(), '-', '')), 'tz', 'x')", nil},
		{"SELECT created_at FROM " + table + " WHERE id = LAST_INSERT_ID()", &c},
		{"SELECT UTC_TIMESTAMP(6)", &a},
	}
	for _, s := range steps {
		if s.dest == nil {
			_, err = conn.ExecContext(ctx, s.q)
		} else {
			err = conn.QueryRowContext(ctx, s.q).Scan(s.dest)
		}
		if err != nil {
			t.Fatalf("%s: %v", s.q, err)
		}
	}
	parse := func(s string) time.Time {
		v, err := time.Parse("2006-01-02 15:04:05.999999", s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return parse(c), parse(b), parse(a)
}

// checkUTCDefault asserts that a '+05:00' session leaving created_at to the
// default stores the UTC instant of the insert.
func checkUTCDefault(ctx context.Context, t *testing.T, db *sql.DB, table string) {
	t.Helper()
	created, before, after := insertLocal(ctx, t, db, table)
	if created.Before(before) || created.After(after) {
		t.Fatalf("created_at %s by a '+05:00' session, want the UTC instant between %s and %s",
			created.Format(time.RFC3339Nano), before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano))
	}
}

func tableRows(ctx context.Context, t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.QueryContext(ctx, "SELECT CONCAT_WS('|', id, HEX(message_id), created_at) FROM "+table+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// created_at's default is the UTC time whatever the session's time_zone:
// on a new table (plain and partitioned), and on a table made by an earlier
// version (default CURRENT_TIMESTAMP(6), the session's local time), which
// migrate changes in place keeping every row. A default an operator chose
// is left alone.
func TestApplyCreatedAtDefaultIsUTC(t *testing.T) {
	for _, partitioned := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "partitioned"}[partitioned]
		t.Run(name, func(t *testing.T) {
			db := testenv.MySQL(t).SQL
			ctx := testenv.Context(t, time.Minute)
			opts := migrations.Options{Partitioned: partitioned}
			if _, err := migrations.Apply(ctx, db, opts); err != nil {
				t.Fatal(err)
			}
			t.Run("new table", func(t *testing.T) { checkUTCDefault(ctx, t, db, "outbox") })

			// The shape earlier versions created, with rows written in it.
			if _, err := db.ExecContext(ctx, "ALTER TABLE outbox ALTER COLUMN created_at SET DEFAULT CURRENT_TIMESTAMP(6)"); err != nil {
				t.Fatal(err)
			}
			insertLocal(ctx, t, db, "outbox")
			before := tableRows(ctx, t, db, "outbox")
			applied, err := migrations.Apply(ctx, db, opts)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(applied, []string{"0003_created_at_utc:outbox"}) {
				t.Fatalf("applied %v, want the created_at default step alone", applied)
			}
			if after := tableRows(ctx, t, db, "outbox"); !reflect.DeepEqual(after, before) {
				t.Fatalf("rows changed by migrate:\nbefore %v\nafter  %v", before, after)
			}
			t.Run("migrated table", func(t *testing.T) { checkUTCDefault(ctx, t, db, "outbox") })
			var n int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox_relay_migrations WHERE version = '0003_created_at_utc:outbox'").Scan(&n); err != nil || n != 1 {
				t.Fatalf("version recorded %d times, %v", n, err)
			}
			if applied, err := migrations.Apply(ctx, db, opts); err != nil || len(applied) != 0 {
				t.Fatalf("migrate again: applied %v, %v; want nothing", applied, err)
			}

			// An operator's own default (here none: producers must write
			// created_at) is theirs.
			if _, err := db.ExecContext(ctx, "ALTER TABLE outbox ALTER COLUMN created_at DROP DEFAULT"); err != nil {
				t.Fatal(err)
			}
			if applied, err := migrations.Apply(ctx, db, opts); err != nil || len(applied) != 0 {
				t.Fatalf("migrate with an operator's default: applied %v, %v; want nothing", applied, err)
			}
			var def sql.NullString
			if err := db.QueryRowContext(ctx, `SELECT COLUMN_DEFAULT FROM information_schema.COLUMNS
				WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox' AND COLUMN_NAME = 'created_at'`).Scan(&def); err != nil {
				t.Fatal(err)
			}
			if def.Valid && def.String != "NULL" {
				t.Fatalf("created_at default %q after migrate, want the operator's (none) kept", def.String)
			}
		})
	}
}
