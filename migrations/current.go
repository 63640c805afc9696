package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

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
			if errors.As(err, &se) && se.Got == "" {
				se.Hint = hint // missing: the migrations were not run
			}
			return err
		}
	}
	return nil
}
