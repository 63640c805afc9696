package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// column is one expected column: its name and its type as
// information_schema.COLUMNS.COLUMN_TYPE shows it, normalised by normType.
type column struct{ name, typ string }

// outboxRole is the role of the outbox table in errors and checks.
const outboxRole = "outbox table"

// shape is a table the relay needs and the columns it must have.
type shape struct {
	role    string // how errors call it: "outbox table" or "table"
	table   string
	columns []column
}

// shapes returns the expected shape of every table, the outbox table (named
// outboxTable) first. Only names and types are compared: defaults,
// nullability and indexes may be tuned by an operator without breaking the
// relay; a missing or retyped column would.
func shapes(outboxTable string) []shape {
	outboxCols := []column{
		{"id", "bigint unsigned"},
		{"message_id", "binary(16)"},
		{"partition_key", "varchar(255)"},
		{"exchange", "varchar(255)"},
		{"routing_key", "varchar(255)"},
		{"message_type", "varchar(255)"},
		{"headers", "json"},
		{"payload", "longblob"},
		{"content_type", "varchar(100)"},
		{"created_at", "datetime(6)"},
		{"available_at", "datetime(6)"},
		{"delivered_at", "datetime(6)"},
		{"attempts", "int unsigned"},
		{"last_error", "varchar(1024)"},
	}
	// outbox_failed: its own id, the original id, the other outbox columns,
	// then why, who and when.
	failedCols := []column{{"id", "bigint unsigned"}, {"outbox_id", "bigint unsigned"}}
	failedCols = append(failedCols, outboxCols[1:]...)
	failedCols = append(failedCols,
		column{"error", "text"},
		column{"source", "varchar(16)"},
		column{"failed_at", "datetime(6)"},
	)
	return []shape{
		{outboxRole, outboxTable, outboxCols},
		{"table", ProgressTable, []column{
			{"relay_name", "varchar(255)"},
			{"outbox_table", "varchar(64)"},
			{"flavor", "varchar(16)"},
			{"gtid_set", "text"},
			{"binlog_file", "varchar(255)"},
			{"binlog_pos", "bigint unsigned"},
			{"stream_ids", "text"},
			{"mode", "varchar(16)"},
			{"mode_reason", "varchar(1024)"},
			{"status", "varchar(16)"},
			{"paused_at", "datetime(6)"},
			{"paused_epoch", "bigint"},
			{"failed_at", "datetime(6)"},
			{"broker", "varchar(255)"},
			{"confirms_stalled_at", "datetime(6)"},
			{"epoch", "bigint"},
			{"leader_instance", "varchar(255)"},
			{"leader_since", "datetime(6)"},
			{"leader_heartbeat", "datetime(6)"},
			{"leader_lease_ms", "bigint unsigned"},
			{"leader_conn_id", "bigint unsigned"},
			{"error_count", "int unsigned"},
			{"last_error", "varchar(1024)"},
			{"last_event_at", "datetime(6)"},
			{"updated_at", "datetime(6)"},
		}},
		{"table", InstancesTable, []column{
			{"relay_name", "varchar(255)"},
			{"instance", "varchar(255)"},
			{"role", "varchar(16)"},
			{"started_at", "datetime(6)"},
			{"heartbeat", "datetime(6)"},
		}},
		{"table", FailedTable, failedCols},
		{"table", DedupTable, []column{
			{"consumer", "varchar(255)"},
			{"message_id", "binary(16)"},
			{"message_name", "varchar(255)"},
			{"processed_at", "datetime(6)"},
		}},
		{"table", AttemptsTable, []column{
			{"consumer", "varchar(255)"},
			{"message_id", "binary(16)"},
			{"attempts", "int unsigned"},
			{"last_error", "varchar(1024)"},
			{"updated_at", "datetime(6)"},
		}},
		{"table", StreamOffsetsTable, []column{
			{"consumer", "varchar(255)"},
			{"stream", "varchar(255)"},
			{"next_offset", "bigint unsigned"},
			{"epoch", "bigint unsigned"},
			{"owner", "varchar(255)"},
			{"claimed_at", "datetime(6)"},
			{"updated_at", "datetime(6)"},
		}},
		{"table", MigrationsTable, []column{
			{"version", "varchar(255)"},
			{"applied_at", "datetime(6)"},
		}},
	}
}

// Names of the fixed tables.
const (
	ProgressTable = "outbox_relay_progress"
	FailedTable   = "outbox_failed"
	DedupTable    = "message_deduplication"
	AttemptsTable = "message_inbox_attempts"
	// StreamOffsetsTable holds dedup.StreamConsumer's offsets.
	StreamOffsetsTable = "stream_consumer_offsets"
	InstancesTable     = "outbox_relay_instances"
	MigrationsTable    = "outbox_relay_migrations"
)

// addedLater reports whether a migration adds the column to an existing
// table: its absence is then the table's earlier shape, which Apply
// upgrades, not a mismatch.
func addedLater(table, column string) bool {
	// 0004_dedup_consumer: the inbox keyed by consumer;
	// 0005_progress_mode_reason: why the relay is in its mode;
	// 0006_pause_and_instances: the pause;
	// 0007_progress_failed_at: when the relay stopped for good;
	// 0008_progress_broker: the RabbitMQ node and stalled confirms;
	// 0009_progress_outbox_table: the table a relay name publishes, its
	// leader's lease and lock connection;
	// 0010_progress_stream_ids: the stream destination's publishing ids.
	return table == DedupTable && column == "consumer" ||
		table == ProgressTable && (column == "mode_reason" || column == "paused_at" || column == "paused_epoch" || column == "failed_at" ||
			column == "broker" || column == "confirms_stalled_at" || column == "outbox_table" || column == "leader_lease_ms" ||
			column == "leader_conn_id" || column == "stream_ids")
}

// ErrSchemaMismatch is matched (errors.Is) by every [*SchemaError].
var ErrSchemaMismatch = errors.New("schema mismatch")

// SchemaError reports an existing table whose shape is not what the relay
// needs. Apply changes nothing when it returns one.
type SchemaError struct {
	Role   string // "outbox table", "table"
	Table  string
	Column string // "" when the problem is the table as a whole
	Got    string // "" when the column is missing
	Want   string
	Hint   string // how to fix it, when there is more to say
}

func (e *SchemaError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q: ", e.Role, e.Table)
	switch {
	case e.Column == "":
		fmt.Fprintf(&b, "is %s, want %s", e.Got, e.Want)
	case e.Got == "":
		fmt.Fprintf(&b, "column %q is missing, want %s", e.Column, e.Want)
	default:
		fmt.Fprintf(&b, "column %q is %s, want %s", e.Column, e.Got, e.Want)
	}
	if e.Hint != "" {
		b.WriteString("; ")
		b.WriteString(e.Hint)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrSchemaMismatch) true.
func (e *SchemaError) Is(target error) bool { return target == ErrSchemaMismatch }

// normType turns a COLUMN_TYPE into the form the expectations use: lower
// case, without an integer's display width, which MariaDB and MySQL < 8.0.19
// show ("bigint(20) unsigned") and MySQL 8.0.19+ does not.
func normType(t string) string {
	t = strings.ToLower(strings.TrimSpace(t))
	for _, p := range [...]string{"tinyint(", "smallint(", "mediumint(", "int(", "bigint("} {
		if strings.HasPrefix(t, p) {
			if end := strings.IndexByte(t, ')'); end > 0 {
				return p[:len(p)-1] + t[end+1:]
			}
		}
	}
	return t
}

// textual reports whether a type stores characters and so must be utf8mb4.
func textual(typ string) bool {
	return strings.HasPrefix(typ, "varchar") || strings.HasPrefix(typ, "char") || strings.HasSuffix(typ, "text")
}

// foundColumn is a column as information_schema shows it.
type foundColumn struct {
	typ     string // normalised
	charset string // "" for non-character columns
}

// readColumns returns the columns of the named tables that exist, keyed by
// table then column. A table without an entry does not exist.
func readColumns(ctx context.Context, q querier, schema string, tables []string) (map[string]map[string]foundColumn, error) {
	args := []any{schema}
	for _, t := range tables {
		args = append(args, t)
	}
	rows, err := q.QueryContext(ctx, `SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, COALESCE(CHARACTER_SET_NAME, '')
		FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = ? AND TABLE_NAME IN (?`+strings.Repeat(",?", len(tables)-1)+`)`, args...)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", strings.Join(tables, ", "), err)
	}
	defer rows.Close()
	found := make(map[string]map[string]foundColumn)
	for rows.Next() {
		var table, name, typ, charset string
		if err := rows.Scan(&table, &name, &typ, &charset); err != nil {
			return nil, fmt.Errorf("read columns: %w", err)
		}
		// information_schema compares names case-insensitively on some
		// servers; on Linux table names are case-sensitive, so keep exact
		// matches only.
		if !contains(tables, table) {
			continue
		}
		if found[table] == nil {
			found[table] = make(map[string]foundColumn)
		}
		found[table][strings.ToLower(name)] = foundColumn{typ: normType(typ), charset: strings.ToLower(charset)}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read columns: %w", err)
	}
	return found, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// checkColumns compares a table's columns with the expected ones.
// checkColumns compares a table's columns with want. A column a later
// migration adds may be missing unless strict (a running relay needs them
// all: Current).
func checkColumns(role, table string, want []column, got map[string]foundColumn, strict bool) error {
	for _, c := range want {
		f, ok := got[c.name]
		if !ok && !strict && addedLater(table, c.name) {
			continue
		}
		if !ok {
			return &SchemaError{Role: role, Table: table, Column: c.name, Want: c.typ}
		}
		if !typeFits(role, f.typ, c.typ) {
			return &SchemaError{Role: role, Table: table, Column: c.name, Got: f.typ, Want: c.typ}
		}
		// Partition keys and routing keys are arbitrary UTF-8; a latin1 or
		// utf8mb3 column would reject or mangle some of them.
		if textual(c.typ) && f.charset != "" && f.charset != "utf8mb4" {
			return &SchemaError{Role: role, Table: table, Column: c.name,
				Got: f.typ + " character set " + f.charset, Want: c.typ + " character set utf8mb4"}
		}
	}
	return nil
}

// typeFits reports whether a column of type got serves where want is
// expected: the same type; MariaDB's JSON, an alias of LONGTEXT (with a
// JSON_VALID check), which the relay reads as text; a VARCHAR widened
// (ALTER … MODIFY, a migration tool's change), which holds every value the
// narrower one did; and, in the outbox table, any BLOB type for a BLOB (a
// payload column narrowed to MEDIUMBLOB bounds the producers' payloads,
// not what the relay can read).
func typeFits(role, got, want string) bool {
	switch {
	case got == want, want == "json" && got == "longtext":
		return true
	case strings.HasPrefix(want, "varchar(") && strings.HasPrefix(got, "varchar("):
		return varcharLen(got) >= varcharLen(want)
	case role == outboxRole && strings.HasSuffix(want, "blob") && strings.HasSuffix(got, "blob"):
		return true
	}
	return false
}

// varcharLen is N of "varchar(N)", 0 when unreadable.
func varcharLen(t string) int {
	n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(t, "varchar("), ")"))
	return n
}

// querier is what the checks need from a *sql.Conn.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// partitioned reports whether table is partitioned.
func partitioned(ctx context.Context, q querier, schema, table string) (bool, error) {
	var n int
	err := q.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PARTITIONS
		WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND PARTITION_NAME IS NOT NULL`, schema, table).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("read partitions of %q: %w", table, err)
	}
	return n > 0, nil
}
