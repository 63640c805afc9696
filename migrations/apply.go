package migrations

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/outbox-relay/outbox-relay/outbox"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

const (
	// lockName serialises concurrent Apply calls on one server.
	lockName = "outbox-relay:migrate"
	// lockWaitSeconds is how long Apply waits for another Apply to finish.
	lockWaitSeconds = 30
	// PartitionDays is how many daily partitions a partitioned outbox table
	// starts with: the day of Apply (UTC) and the following days. Later days
	// land in pmax until partition maintenance splits them out.
	PartitionDays = 7
)

// Options selects what Apply creates.
type Options struct {
	// Table is the outbox table's name; "" means outbox.DefaultTable.
	Table string
	// Partitioned creates the outbox table range-partitioned by day on
	// created_at. It applies only when the table is created: an existing
	// unpartitioned table is refused, not converted.
	Partitioned bool
}

// migration is one version: a SQL file run as a whole.
type migration struct {
	version string   // as recorded in outbox_relay_migrations
	file    string   // under sql/, a text/template
	tables  []string // tables it creates; if one is gone it runs again
}

// plan returns the migrations for opts in the order they run.
func plan(table string, partitionedTable bool) []migration {
	outboxFile := "0001_outbox.sql"
	if partitionedTable {
		outboxFile = "0001_outbox_partitioned.sql"
	}
	return []migration{
		{"0001_relay_tables", "0001_relay_tables.sql", []string{ProgressTable, InstancesTable, FailedTable, DedupTable}},
		{"0001_outbox:" + table, outboxFile, []string{table}},
		// The inbox keyed by consumer; it runs again (without effect on an
		// upgraded inbox) if the attempts table is gone.
		{"0004_dedup_consumer", "0004_dedup_consumer.sql", []string{DedupTable, AttemptsTable}},
		// mode_reason on a progress table created before it existed; a
		// progress table created again by 0001 already has it.
		{"0005_progress_mode_reason", "0005_progress_mode_reason.sql", nil},
		// Pause columns and the instances table; it runs again (without
		// effect on the progress table) if the instances table is gone.
		{"0006_pause_and_instances", "0006_pause_and_instances.sql", []string{InstancesTable}},
		// failed_at on a progress table created before it existed.
		{"0007_progress_failed_at", "0007_progress_failed_at.sql", nil},
		// broker and confirms_stalled_at on a progress table created
		// before they existed.
		{"0008_progress_broker", "0008_progress_broker.sql", nil},
		// outbox_table, leader_lease_ms and leader_conn_id on a progress
		// table created
		// before they existed.
		{"0009_progress_outbox_table", "0009_progress_outbox_table.sql", nil},
		// stream_ids on a progress table created before it existed.
		{"0010_progress_stream_ids", "0010_progress_stream_ids.sql", nil},
		// dedup.StreamConsumer's offsets; it runs again if the table is gone.
		{"0011_stream_consumer_offsets", "0011_stream_consumer_offsets.sql", []string{StreamOffsetsTable}},
	}
}

// Apply brings the schema of db's current database (the DSN's) up to date
// for opts and returns the versions it applied, in order; none when the
// schema was already complete.
//
// Contract:
//   - It holds GET_LOCK('outbox-relay:migrate', 30) on one connection for
//     the whole run, so concurrent calls serialise (the second finds nothing
//     to do). Waiting longer than 30 s is an error.
//   - Existing tables are checked first: a missing or differently typed
//     column fails with a *SchemaError (errors.Is ErrSchemaMismatch) before
//     anything is created. Extra columns and indexes are fine. The one
//     missing columns accepted are message_deduplication's consumer (version
//     0004_dedup_consumer adds it and keys the table by it, keeping its rows)
//     and outbox_relay_progress's mode_reason (0005_progress_mode_reason),
//     paused_at and paused_epoch (0006_pause_and_instances), failed_at
//     (0007_progress_failed_at), broker and confirms_stalled_at
//     (0008_progress_broker), and outbox_table, leader_lease_ms and
//     leader_conn_id (0009_progress_outbox_table), and stream_ids
//     (0010_progress_stream_ids).
//   - A version runs when it is not recorded, or when a table it creates no
//     longer exists. Tables are only ever created (CREATE TABLE IF NOT
//     EXISTS), never altered destructively or dropped. Two steps follow the
//     outbox's state instead: missing poller indexes are added, and a
//     created_at default of the session's local time (CURRENT_TIMESTAMP)
//     becomes UTC_TIMESTAMP(6) (recorded as 0003_created_at_utc:<table>).
//   - DDL is not transactional: if Apply fails half way, the created tables
//     stay and the next Apply finishes the work.
func Apply(ctx context.Context, db *sql.DB, opts Options) (applied []string, err error) {
	table := opts.Table
	if table == "" {
		table = outbox.DefaultTable
	}
	quoted, err := outbox.QuoteTable(table)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}

	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: connect: %w", err)
	}
	defer conn.Close()

	if err := lock(ctx, conn); err != nil {
		return nil, err
	}
	defer unlock(ctx, conn)

	schema, err := currentSchema(ctx, conn)
	if err != nil {
		return nil, err
	}
	// Existing tables must have the right shape before we add anything.
	if err := check(ctx, conn, schema, table, opts.Partitioned); err != nil {
		return nil, err
	}
	data := templateData{Table: quoted, Partitions: dailyPartitions(time.Now(), PartitionDays)}
	applied, err = applyVersions(ctx, conn, schema, table, opts.Partitioned, data)
	if err != nil {
		return applied, err
	}
	fixed, err := upgradeOutbox(ctx, conn, schema, table, data)
	applied = append(applied, fixed...)
	if err != nil {
		return applied, err
	}
	// Verify what we created too: it catches a server that silently
	// substituted a type (e.g. a JSON column on a server without JSON).
	if err := check(ctx, conn, schema, table, opts.Partitioned); err != nil {
		return applied, err
	}
	return applied, nil
}

// currentSchema is the connection's current database; none is an error.
func currentSchema(ctx context.Context, conn *sql.Conn) (string, error) {
	var schema sql.NullString
	if err := conn.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&schema); err != nil {
		return "", fmt.Errorf("migrate: read current database: %w", err)
	}
	if !schema.Valid || schema.String == "" {
		return "", fmt.Errorf("migrate: no database selected: name one in the DSN (user:pass@tcp(host:port)/dbname)")
	}
	return schema.String, nil
}

// applyVersions runs the versions of the plan that are not recorded, or
// whose tables no longer all exist, and returns those it ran, in order. An
// existing outbox table is planned with its actual layout (partitioned or
// not), so that the recorded versions describe it.
func applyVersions(ctx context.Context, conn *sql.Conn, schema, table string, wantPartitioned bool, data templateData) (applied []string, err error) {
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+MigrationsTable+` (
		version    VARCHAR(255) NOT NULL,
		applied_at DATETIME(6)  NOT NULL,
		PRIMARY KEY (version)
	) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`); err != nil {
		return nil, fmt.Errorf("migrate: create %s: %w", MigrationsTable, err)
	}
	done, err := recorded(ctx, conn)
	if err != nil {
		return nil, err
	}
	isPartitioned := wantPartitioned
	if existing, err := readColumns(ctx, conn, schema, []string{table}); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	} else if existing[table] != nil {
		if isPartitioned, err = partitioned(ctx, conn, schema, table); err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
	}
	for _, m := range plan(table, isPartitioned) {
		need := !done[m.version]
		if !need && len(m.tables) > 0 {
			present, err := readColumns(ctx, conn, schema, m.tables)
			if err != nil {
				return applied, fmt.Errorf("migrate: %w", err)
			}
			need = len(present) < len(m.tables)
		}
		if !need {
			continue
		}
		if err := run(ctx, conn, m, data); err != nil {
			return applied, err
		}
		applied = append(applied, m.version)
	}
	return applied, nil
}

// upgradeOutbox brings an outbox created by an earlier version up to date:
// the poller's indexes added, a created_at default of the session's local
// time made UTC. It returns the steps it took, as Apply reports them.
func upgradeOutbox(ctx context.Context, conn *sql.Conn, schema, table string, data templateData) (applied []string, err error) {
	added, err := ensureIndexes(ctx, conn, schema, table, data.Table)
	if err != nil {
		return nil, err
	}
	if added {
		applied = append(applied, "0002_outbox_indexes:"+table)
	}
	changed, err := ensureUTCDefault(ctx, conn, schema, table, data)
	if err != nil {
		return applied, err
	}
	if changed {
		applied = append(applied, createdAtUTC(table).version)
	}
	return applied, nil
}

// check compares every existing table with its expected shape and, when a
// partitioned outbox table is asked for, refuses an unpartitioned one.
func check(ctx context.Context, conn *sql.Conn, schema, table string, wantPartitioned bool) error {
	want := shapes(table)
	names := make([]string, len(want))
	for i, s := range want {
		names[i] = s.table
	}
	found, err := readColumns(ctx, conn, schema, names)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, s := range want {
		if got := found[s.table]; got != nil {
			if err := checkColumns(s.role, s.table, s.columns, got, false); err != nil {
				return err
			}
		}
	}
	if wantPartitioned && found[table] != nil {
		p, err := partitioned(ctx, conn, schema, table)
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		if !p {
			return &SchemaError{Role: outboxRole, Table: table, Got: "not partitioned", Want: "partitioned by day on created_at",
				Hint: "migrate does not convert an existing table; repartition it yourself (ALTER TABLE ... PARTITION BY RANGE COLUMNS(created_at) ..., with PRIMARY KEY (id, created_at)) or migrate without --partitioned"}
		}
	}
	return nil
}

// recorded returns the versions already applied.
func recorded(ctx context.Context, conn *sql.Conn) (map[string]bool, error) {
	rows, err := conn.QueryContext(ctx, "SELECT version FROM "+MigrationsTable)
	if err != nil {
		return nil, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	defer rows.Close()
	done := make(map[string]bool)
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("migrate: read applied versions: %w", err)
		}
		done[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	return done, nil
}

// templateData fills the SQL templates.
type templateData struct {
	Table      string // the outbox table, quoted
	Partitions string // partition definitions for the partitioned variant
}

// run executes one migration's statements and records its version.
func run(ctx context.Context, conn *sql.Conn, m migration, data templateData) error {
	stmts, err := render(m.file, data)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", m.version, err)
	}
	for _, stmt := range stmts {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("migrate %s: %s: %w", m.version, firstLine(stmt), err)
		}
	}
	if _, err := conn.ExecContext(ctx, `INSERT INTO `+MigrationsTable+` (version, applied_at)
		VALUES (?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE applied_at = UTC_TIMESTAMP(6)`, m.version); err != nil {
		return fmt.Errorf("migrate %s: record version: %w", m.version, err)
	}
	return nil
}

// render executes the template sql/<file> and splits it into statements.
// Statements end with a semicolon at the end of a line; comment-only chunks
// are dropped.
func render(file string, data templateData) ([]string, error) {
	src, err := sqlFiles.ReadFile("sql/" + file)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	tmpl, err := template.New(file).Option("missingkey=error").Parse(string(src))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", file, err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, data); err != nil {
		return nil, fmt.Errorf("render %s: %w", file, err)
	}
	var stmts []string
	for _, chunk := range strings.Split(buf.String(), ";\n") {
		if s := stripComments(chunk); s != "" {
			stmts = append(stmts, s)
		}
	}
	return stmts, nil
}

// stripComments drops whole-line "--" comments and surrounding space.
func stripComments(chunk string) string {
	var b strings.Builder
	for _, line := range strings.Split(chunk, "\n") {
		if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(b.String()), ";"))
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[:i])
	}
	return s
}

// dailyPartitions returns the partition list for a table partitioned by
// RANGE COLUMNS(created_at): one partition per UTC day from now's day on,
// named pYYYYMMDD and holding that day (the first also holds anything
// older), then pmax for everything later.
func dailyPartitions(now time.Time, days int) string {
	day := now.UTC().Truncate(24 * time.Hour)
	var b strings.Builder
	for i := 0; i < days; i++ {
		d := day.AddDate(0, 0, i)
		fmt.Fprintf(&b, "    PARTITION p%s VALUES LESS THAN ('%s'),\n",
			d.Format("20060102"), d.AddDate(0, 0, 1).Format("2006-01-02 15:04:05"))
	}
	b.WriteString("    PARTITION pmax VALUES LESS THAN (MAXVALUE)")
	return b.String()
}

// lock takes the migrate lock on conn.
func lock(ctx context.Context, conn *sql.Conn) error {
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", lockName, lockWaitSeconds).Scan(&got); err != nil {
		return fmt.Errorf("migrate: take lock %q: %w", lockName, err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("migrate: lock %q still held by another migrate after %d s; try again when it has finished", lockName, lockWaitSeconds)
	}
	return nil
}

// unlock releases the migrate lock, even when ctx is done. If that fails the
// connection is discarded instead of going back to the pool, which ends the
// session and with it the lock.
func unlock(ctx context.Context, conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "DO RELEASE_LOCK(?)", lockName); err != nil {
		// Make the pool drop this connection (and with it the lock)
		// instead of handing it out again.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}

// outboxIndexes are the poller's indexes, as 0001_outbox*.sql declares them
// (see the reasons there); keep the two in step.
func outboxIndexes() [][2]string {
	return [][2]string{
		{"idx_partition_id", "partition_key, id"},
		{"idx_head", "partition_key, delivered_at, available_at, id"},
		{"idx_due", "delivered_at, available_at"},
	}
}

// ensureIndexes adds the outbox indexes an existing table lacks (one made
// by an earlier version). It only ever adds; it reports whether it did.
func ensureIndexes(ctx context.Context, conn *sql.Conn, schema, table, quoted string) (bool, error) {
	rows, err := conn.QueryContext(ctx, `SELECT DISTINCT index_name FROM information_schema.STATISTICS
		WHERE table_schema = ? AND table_name = ?`, schema, table)
	if err != nil {
		return false, fmt.Errorf("migrate: read indexes of %s: %w", table, err)
	}
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return false, fmt.Errorf("migrate: read indexes of %s: %w", table, err)
		}
		have[name] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("migrate: read indexes of %s: %w", table, err)
	}
	added := false
	for _, ix := range outboxIndexes() {
		if have[ix[0]] {
			continue
		}
		if _, err := conn.ExecContext(ctx, "ALTER TABLE "+quoted+" ADD INDEX "+ix[0]+" ("+ix[1]+")"); err != nil {
			return added, fmt.Errorf("migrate: add index %s to %s: %w", ix[0], table, err)
		}
		added = true
	}
	return added, nil
}
