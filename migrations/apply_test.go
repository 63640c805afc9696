package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// columns returns "name type" of a table's columns in ordinal order, types
// normalised the way MariaDB shows them.
func columns(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			t.Fatal(err)
		}
		out = append(out, name+" "+typ)
	}
	return out
}

var wantOutbox = []string{
	"id bigint(20) unsigned", "message_id binary(16)", "partition_key varchar(255)",
	"exchange varchar(255)", "routing_key varchar(255)", "message_type varchar(255)",
	"headers longtext", "payload longblob", "content_type varchar(100)",
	"created_at datetime(6)", "available_at datetime(6)", "delivered_at datetime(6)",
	"attempts int(10) unsigned", "last_error varchar(1024)",
}

func TestApplyEmptyThenNoop(t *testing.T) {
	db := testenv.MySQL(t).SQL
	ctx := context.Background()

	applied, err := migrations.Apply(ctx, db, migrations.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0001_relay_tables", "0001_outbox:outbox", "0004_dedup_consumer", "0005_progress_mode_reason", "0006_pause_and_instances", "0007_progress_failed_at", "0008_progress_broker", "0009_progress_outbox_table", "0010_progress_stream_ids", "0011_stream_consumer_offsets"}; !reflect.DeepEqual(applied, want) {
		t.Fatalf("applied %v, want %v", applied, want)
	}
	applied, err = migrations.Apply(ctx, db, migrations.Options{})
	if err != nil || len(applied) != 0 {
		t.Fatalf("second Apply: applied %v, err %v; want nothing", applied, err)
	}

	// The outbox's column names are exactly outbox.Columns, in order.
	var names []string
	for _, c := range columns(t, db, "outbox") {
		names = append(names, strings.Fields(c)[0])
	}
	if !reflect.DeepEqual(names, outbox.Columns()) {
		t.Fatalf("outbox columns %v, want outbox.Columns() %v", names, outbox.Columns())
	}
	if got := columns(t, db, "outbox"); !reflect.DeepEqual(got, wantOutbox) {
		t.Fatalf("outbox columns\n got %v\nwant %v", got, wantOutbox)
	}
	want := map[string][]string{
		"outbox_relay_progress": {"relay_name varchar(255)", "outbox_table varchar(64)", "flavor varchar(16)", "gtid_set text",
			"binlog_file varchar(255)", "binlog_pos bigint(20) unsigned", "stream_ids text", "mode varchar(16)", "mode_reason varchar(1024)", "status varchar(16)",
			"paused_at datetime(6)", "paused_epoch bigint(20)", "failed_at datetime(6)", "broker varchar(255)", "confirms_stalled_at datetime(6)", "epoch bigint(20)", "leader_instance varchar(255)", "leader_since datetime(6)",
			"leader_heartbeat datetime(6)", "leader_lease_ms bigint(20) unsigned", "leader_conn_id bigint(20) unsigned", "error_count int(10) unsigned", "last_error varchar(1024)",
			"last_event_at datetime(6)", "updated_at datetime(6)"},
		"outbox_failed": append(append([]string{"id bigint(20) unsigned", "outbox_id bigint(20) unsigned"}, wantOutbox[1:]...),
			"error text", "source varchar(16)", "failed_at datetime(6)"),
		"message_deduplication":  wantDedupColumns,
		"message_inbox_attempts": wantAttempts,
		"stream_consumer_offsets": {"consumer varchar(255)", "stream varchar(255)", "next_offset bigint(20) unsigned",
			"epoch bigint(20) unsigned", "owner varchar(255)", "claimed_at datetime(6)", "updated_at datetime(6)"},
		"outbox_relay_migrations": {"version varchar(255)", "applied_at datetime(6)"},
		"outbox_relay_instances": {"relay_name varchar(255)", "instance varchar(255)", "role varchar(16)",
			"started_at datetime(6)", "heartbeat datetime(6)"},
	}
	for table, cols := range want {
		if got := columns(t, db, table); !reflect.DeepEqual(got, cols) {
			t.Errorf("%s columns\n got %v\nwant %v", table, got, cols)
		}
	}

	// Defaults the relay relies on.
	if _, err := db.Exec("INSERT INTO outbox_relay_progress (relay_name) VALUES ('default')"); err != nil {
		t.Fatal(err)
	}
	var mode, status string
	var epoch, errs int
	if err := db.QueryRow("SELECT mode, status, epoch, error_count FROM outbox_relay_progress").Scan(&mode, &status, &epoch, &errs); err != nil {
		t.Fatal(err)
	}
	if mode != "binlog" || status != "ACTIVE" || epoch != 0 || errs != 0 {
		t.Fatalf("progress defaults: %s %s %d %d", mode, status, epoch, errs)
	}

	// A unique message_id on the plain table.
	if _, err := db.Exec("INSERT INTO outbox (message_id, routing_key, payload) VALUES (REPEAT('a',16), 'r', ''), (REPEAT('a',16), 'r', '')"); err == nil {
		t.Fatal("duplicate message_id accepted")
	}

	// A second outbox table in the same database gets its own version.
	applied, err = migrations.Apply(ctx, db, migrations.Options{Table: "orders_outbox"})
	if err != nil || !reflect.DeepEqual(applied, []string{"0001_outbox:orders_outbox"}) {
		t.Fatalf("applied %v, err %v", applied, err)
	}

	// A dropped outbox table is created again (its version is recorded).
	if _, err := db.Exec("DROP TABLE orders_outbox"); err != nil {
		t.Fatal(err)
	}
	applied, err = migrations.Apply(ctx, db, migrations.Options{Table: "orders_outbox"})
	if err != nil || !reflect.DeepEqual(applied, []string{"0001_outbox:orders_outbox"}) {
		t.Fatalf("after drop: applied %v, err %v", applied, err)
	}
}

func TestApplyPartitioned(t *testing.T) {
	db := testenv.MySQL(t).SQL
	ctx := context.Background()
	before := time.Now().UTC()
	applied, err := migrations.Apply(ctx, db, migrations.Options{Partitioned: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 10 {
		t.Fatalf("applied %v", applied)
	}
	rows, err := db.Query(`SELECT PARTITION_NAME, PARTITION_DESCRIPTION FROM information_schema.PARTITIONS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox' ORDER BY PARTITION_ORDINAL_POSITION`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names, bounds []string
	for rows.Next() {
		var n, d string
		if err := rows.Scan(&n, &d); err != nil {
			t.Fatal(err)
		}
		names, bounds = append(names, n), append(bounds, d)
	}
	if len(names) != migrations.PartitionDays+1 || names[len(names)-1] != "pmax" || bounds[len(bounds)-1] != "MAXVALUE" {
		t.Fatalf("partitions %v %v", names, bounds)
	}
	// Daily, from the day of Apply (UTC) on.
	day := before.Truncate(24 * time.Hour)
	if names[0] != "p"+day.Format("20060102") && names[0] != "p"+day.AddDate(0, 0, 1).Format("20060102") {
		t.Fatalf("first partition %s, want today's", names[0])
	}
	first, _ := time.Parse("p20060102", names[0])
	for i := 0; i < migrations.PartitionDays; i++ {
		d := first.AddDate(0, 0, i)
		if names[i] != "p"+d.Format("20060102") || bounds[i] != fmt.Sprintf("'%s'", d.AddDate(0, 0, 1).Format("2006-01-02 15:04:05")) {
			t.Fatalf("partition %d: %s < %s", i, names[i], bounds[i])
		}
	}
	// PRIMARY KEY (id, created_at); message_id indexed but not unique.
	var pk string
	if err := db.QueryRow(`SELECT GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) FROM information_schema.STATISTICS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox' AND INDEX_NAME = 'PRIMARY'`).Scan(&pk); err != nil || pk != "id,created_at" {
		t.Fatalf("primary key %q, %v", pk, err)
	}
	var nonUnique int
	if err := db.QueryRow(`SELECT NON_UNIQUE FROM information_schema.STATISTICS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox' AND COLUMN_NAME = 'message_id'`).Scan(&nonUnique); err != nil || nonUnique != 1 {
		t.Fatalf("message_id index non_unique=%d, %v", nonUnique, err)
	}
	if got := columns(t, db, "outbox"); !reflect.DeepEqual(got, wantOutbox) {
		t.Fatalf("outbox columns\n got %v\nwant %v", got, wantOutbox)
	}

	// Enqueue works on it, and Apply again changes nothing (with or without
	// --partitioned).
	if _, err := outbox.Enqueue(ctx, db, outbox.Message{RoutingKey: "r", Payload: []byte{0}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []bool{true, false} {
		if applied, err := migrations.Apply(ctx, db, migrations.Options{Partitioned: p}); err != nil || len(applied) != 0 {
			t.Fatalf("Apply(Partitioned=%v) again: %v, %v", p, applied, err)
		}
	}
}

func TestApplyRefusesUnpartitionedForPartitioned(t *testing.T) {
	db := testenv.MySQL(t).SQL
	ctx := context.Background()
	if _, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	_, err := migrations.Apply(ctx, db, migrations.Options{Partitioned: true})
	if !errors.Is(err, migrations.ErrSchemaMismatch) || !strings.Contains(err.Error(), "not partitioned") {
		t.Fatalf("err = %v", err)
	}
}

func TestApplyShapeMismatch(t *testing.T) {
	cases := []struct {
		name, ddl, want string
	}{
		{"narrow column",
			"CREATE TABLE outbox (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, message_id BINARY(16) NOT NULL, partition_key VARCHAR(255) NOT NULL DEFAULT '', exchange VARCHAR(255) NOT NULL DEFAULT '', routing_key VARCHAR(100) NOT NULL)",
			`outbox table "outbox": column "routing_key" is varchar(100), want varchar(255)`},
		{"missing column",
			"CREATE TABLE outbox (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, message_id BINARY(16) NOT NULL, extra INT)",
			`outbox table "outbox": column "partition_key" is missing, want varchar(255)`},
		{"latin1 column",
			"CREATE TABLE outbox (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, message_id BINARY(16) NOT NULL, partition_key VARCHAR(255) CHARACTER SET latin1 NOT NULL)",
			`outbox table "outbox": column "partition_key" is varchar(255) character set latin1, want varchar(255) character set utf8mb4`},
		{"other table",
			"CREATE TABLE message_deduplication (message_id CHAR(36) PRIMARY KEY)",
			`table "message_deduplication": column "message_id" is char(36), want binary(16)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := testenv.MySQL(t).SQL
			if _, err := db.Exec(c.ddl); err != nil {
				t.Fatal(err)
			}
			applied, err := migrations.Apply(context.Background(), db, migrations.Options{})
			var se *migrations.SchemaError
			if !errors.As(err, &se) || !errors.Is(err, migrations.ErrSchemaMismatch) || err.Error() != c.want {
				t.Fatalf("err = %v\nwant %s", err, c.want)
			}
			if applied != nil {
				t.Fatalf("applied %v despite the mismatch", applied)
			}
			// Nothing was created.
			var n int
			if err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("%d tables after a refused Apply, %v", n, err)
			}
		})
	}
}

func TestApplyAdoptsCompatibleTable(t *testing.T) {
	db := testenv.MySQL(t).SQL
	ctx := context.Background()
	// An outbox created by hand with the right columns plus an extra one.
	if _, err := db.Exec(`CREATE TABLE outbox (
		id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, message_id BINARY(16) NOT NULL,
		partition_key VARCHAR(255) NOT NULL DEFAULT '', exchange VARCHAR(255) NOT NULL DEFAULT '',
		routing_key VARCHAR(255) NOT NULL, message_type VARCHAR(255) NOT NULL DEFAULT '', headers JSON NULL,
		payload LONGBLOB NOT NULL, content_type VARCHAR(100) NOT NULL DEFAULT 'application/json',
		created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), available_at DATETIME(6) NULL,
		delivered_at DATETIME(6) NULL, attempts INT UNSIGNED NOT NULL DEFAULT 0, last_error VARCHAR(1024) NULL,
		tenant VARCHAR(20) NULL)`); err != nil {
		t.Fatal(err)
	}
	// Adopted as it is, plus the poller's indexes it lacks and the UTC
	// default of created_at.
	applied, err := migrations.Apply(ctx, db, migrations.Options{})
	want := []string{"0001_relay_tables", "0001_outbox:outbox", "0004_dedup_consumer", "0005_progress_mode_reason", "0006_pause_and_instances", "0007_progress_failed_at", "0008_progress_broker", "0009_progress_outbox_table", "0010_progress_stream_ids", "0011_stream_consumer_offsets", "0002_outbox_indexes:outbox", "0003_created_at_utc:outbox"}
	if err != nil || strings.Join(applied, ",") != strings.Join(want, ",") {
		t.Fatalf("applied %v, err %v; want %v", applied, err, want)
	}
}

func TestApplyConcurrent(t *testing.T) {
	db := testenv.MySQL(t).SQL
	ctx := context.Background()
	const runs = 4
	var wg sync.WaitGroup
	results := make([][]string, runs)
	errs := make([]error, runs)
	for i := 0; i < runs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = migrations.Apply(ctx, db, migrations.Options{})
		}()
	}
	wg.Wait()
	total := 0
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("run %d: %v", i, errs[i])
		}
		total += len(results[i])
	}
	// Each version applied by exactly one run.
	if total != 10 {
		t.Fatalf("versions applied %v in total, want 10", results)
	}
}

func TestApplyBadTable(t *testing.T) {
	db := testenv.MySQL(t).SQL
	if _, err := migrations.Apply(context.Background(), db, migrations.Options{Table: "drop table x;--"}); err == nil {
		t.Fatal("bad table name accepted")
	}
}
