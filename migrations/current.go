package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// goneHint is the fix for an outbox column that is missing: every outbox
// column comes from the first migration, so it was renamed away or dropped
// (migrate would add an empty one beside the renamed column).
const goneHint = "it was renamed away or dropped: give the column its name back " +
	"(running `outbox-relay migrate` would add an empty column of that name, not the renamed one's data)"

// ColumnGone reports whether err is a *SchemaError for an outbox column
// that is missing: renamed away or dropped after the table was made, a
// state a DBA's ALTER or a migration tool may put the table in for a while.
func ColumnGone(err error) bool {
	var se *SchemaError
	return errors.As(err, &se) && se.Role == outboxRole && se.Column != "" && se.Got == ""
}

// Current checks that the tables a running relay uses (the outbox table
// named table, outbox_relay_progress, outbox_relay_instances, outbox_failed)
// exist with every column this version writes, without changing anything. A
// missing table or column, including one a later migration adds, is a
// *SchemaError whose Hint names `outbox-relay migrate`: the relay was
// upgraded and its migrations were not run.
func Current(ctx context.Context, db *sql.DB, table string) error {
	var schema sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&schema); err != nil {
		return fmt.Errorf("read current database: %w", err)
	}
	need := map[string]bool{table: true, ProgressTable: true, InstancesTable: true, FailedTable: true}
	var want []shape
	var names []string
	for _, s := range shapes(table) {
		if need[s.table] {
			want = append(want, s)
			names = append(names, s.table)
		}
	}
	found, err := readColumns(ctx, db, schema.String, names)
	if err != nil {
		return err
	}
	const hint = "run `outbox-relay migrate` with the same --mysql-dsn and --table (it only adds what is missing)"
	for _, s := range want {
		got := found[s.table]
		if got == nil {
			return &SchemaError{Role: s.role, Table: s.table, Got: "missing", Want: "present", Hint: hint}
		}
		if err := checkColumns(s.role, s.table, s.columns, got, true); err != nil {
			var se *SchemaError
			switch {
			case errors.As(err, &se) && se.Got == "" && s.role == outboxRole:
				// Every outbox column comes from the first migration:
				// this one was renamed away or dropped.
				se.Hint = goneHint
			case errors.As(err, &se) && se.Got == "":
				se.Hint = hint // missing: the migrations were not run
			}
			return err
		}
	}
	return nil
}
