package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// createdAtUTC is the step that gives an existing outbox table the UTC
// default of created_at (sql/0003_created_at_utc.sql).
func createdAtUTC(table string) migration {
	return migration{"0003_created_at_utc:" + table, "0003_created_at_utc.sql", nil}
}

// sessionTimeDefault reports whether a COLUMN_DEFAULT is the session's
// local time (CURRENT_TIMESTAMP(6), NOW(6), as MariaDB or MySQL show it):
// the default earlier versions created, and wrong whenever a producer's
// session time_zone is not UTC.
func sessionTimeDefault(def string) bool {
	d := strings.ToLower(strings.TrimSpace(def))
	for _, p := range [...]string{"current_timestamp", "now(", "localtime"} {
		if strings.HasPrefix(d, p) {
			return true
		}
	}
	return false
}

// ensureUTCDefault changes created_at's default of an existing outbox table
// from the session's local time to UTC_TIMESTAMP(6), and records the step.
// Only that default is replaced: one an operator chose (a literal, none)
// stays. It reports whether it changed the table.
func ensureUTCDefault(ctx context.Context, conn *sql.Conn, schema, table string, data templateData) (bool, error) {
	var def sql.NullString
	err := conn.QueryRowContext(ctx, `SELECT COLUMN_DEFAULT FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = 'created_at'`, schema, table).Scan(&def)
	if err != nil {
		return false, fmt.Errorf("migrate: read the created_at default of %s: %w", table, err)
	}
	if !def.Valid || !sessionTimeDefault(def.String) {
		return false, nil
	}
	if err := run(ctx, conn, createdAtUTC(table), data); err != nil {
		return false, err
	}
	return true, nil
}
