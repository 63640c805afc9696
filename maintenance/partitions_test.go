package maintenance_test

import (
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/maintenance"
)

// partitionNames returns the outbox table's partitions in order.
func partitionNames(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT PARTITION_NAME FROM information_schema.PARTITIONS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox' ORDER BY PARTITION_ORDINAL_POSITION`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func dayName(d time.Time) string { return "p" + d.Format("20060102") }

// utcToday is the server's UTC day.
func utcToday(t *testing.T, db *sql.DB) time.Time {
	t.Helper()
	var s string
	if err := db.QueryRow("SELECT DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%d')").Scan(&s); err != nil {
		t.Fatal(err)
	}
	d, err := time.Parse("2006-01-02", s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// withOldDays splits the first partition of a fresh partitioned outbox
// (migrate makes today's, the next six days' and pmax) into one per day from
// today-days on, as if the table had been in use that long.
func withOldDays(t *testing.T, db *sql.DB, today time.Time, days int) {
	t.Helper()
	var defs []string
	for i := days; i >= 0; i-- {
		d := today.AddDate(0, 0, -i)
		defs = append(defs, fmt.Sprintf("PARTITION %s VALUES LESS THAN ('%s')", dayName(d), d.AddDate(0, 0, 1).Format("2006-01-02")))
	}
	exec(t, db, "ALTER TABLE outbox REORGANIZE PARTITION "+dayName(today)+" INTO ("+strings.Join(defs, ", ")+")")
}

// insertAt inserts an outbox row created on day (noon), delivered (marked)
// or not, and returns its id.
func insertAt(t *testing.T, db *sql.DB, day time.Time, delivered bool) uint64 {
	t.Helper()
	id := newID(t)
	var at any
	if delivered {
		at = day.Add(13 * time.Hour).Format("2006-01-02 15:04:05")
	}
	res := exec(t, db, "INSERT INTO outbox (message_id, routing_key, payload, created_at, delivered_at) VALUES (?, 'rk', '{}', ?, ?)",
		id[:], day.Add(12*time.Hour).Format("2006-01-02 15:04:05"), at)
	n, err := res.LastInsertId()
	if err != nil {
		t.Fatal(err)
	}
	return uint64(n)
}

// Partitions adds the days up to the lookahead (split out of pmax, which
// stays last), and drops the days past the retention that hold no pending
// row: empty ones and ones whose rows are all marked delivered. A day with
// a pending row is kept, and its row is still there. The dry run reports
// the same and changes nothing; a second run has nothing to do.
func TestPartitionsAddAndDrop(t *testing.T) {
	db, ctx := setup(t, true)
	today := utcToday(t, db)
	withOldDays(t, db, today, 12)
	pendingID := insertAt(t, db, today.AddDate(0, 0, -12), false) // kept: pending
	insertAt(t, db, today.AddDate(0, 0, -11), true)               // dropped: delivered
	keepID := insertAt(t, db, today.AddDate(0, 0, -3), false)     // inside the retention
	insertAt(t, db, today.AddDate(0, 0, -12), true)               // delivered, with the pending one
	before := partitionNames(t, db)

	o := maintenance.PartitionOptions{Lookahead: 9, Retention: 7 * day, DryRun: true}
	dry, err := maintenance.Partitions(ctx, db, o)
	if err != nil {
		t.Fatal(err)
	}
	if got := partitionNames(t, db); !slices.Equal(got, before) {
		t.Fatalf("the dry run changed the partitions: %v", got)
	}

	o.DryRun = false
	rep, err := maintenance.Partitions(ctx, db, o)
	if err != nil {
		t.Fatal(err)
	}
	wantAdded := []string{dayName(today.AddDate(0, 0, 7)), dayName(today.AddDate(0, 0, 8)), dayName(today.AddDate(0, 0, 9))}
	// Day -7's partition holds rows up to the start of day -6, less than
	// 7 days ago only for part of it: kept. Days -11 to -8 go.
	var wantDropped []string
	for i := 11; i >= 8; i-- {
		wantDropped = append(wantDropped, dayName(today.AddDate(0, 0, -i)))
	}
	wantKept := []maintenance.Kept{{Name: dayName(today.AddDate(0, 0, -12)), Pending: 1}}
	if rep.Skipped || !slices.Equal(rep.Added, wantAdded) || !slices.Equal(rep.Dropped, wantDropped) || !slices.Equal(rep.Kept, wantKept) {
		t.Fatalf("report %+v\nwant added %v, dropped %v, kept %v", rep, wantAdded, wantDropped, wantKept)
	}
	if !slices.Equal(dry.Added, rep.Added) || !slices.Equal(dry.Dropped, rep.Dropped) || !slices.Equal(dry.Kept, rep.Kept) {
		t.Fatalf("dry run %+v differs from the run %+v", dry, rep)
	}
	var want []string
	for i := -12; i <= 9; i++ {
		if i < -11 || i > -8 {
			want = append(want, dayName(today.AddDate(0, 0, i)))
		}
	}
	want = append(want, "pmax")
	if got := partitionNames(t, db); !slices.Equal(got, want) {
		t.Fatalf("partitions %v\nwant %v", got, want)
	}
	if got := ids(t, db, "delivered_at IS NULL"); !slices.Equal(got, []uint64{pendingID, keepID}) {
		t.Fatalf("pending rows %v, want %v", got, []uint64{pendingID, keepID})
	}

	rep, err = maintenance.Partitions(ctx, db, o)
	if err != nil || len(rep.Added) != 0 || len(rep.Dropped) != 0 || len(rep.Kept) != 1 {
		t.Fatalf("second run: %+v, %v; want nothing added or dropped", rep, err)
	}
}

// A run while another holds the table's partitions lock skips and changes
// nothing; once the lock is free it does its work. Another table's lock
// does not matter.
func TestPartitionsSkipsWhileAnotherRunHoldsTheLock(t *testing.T) {
	db, ctx := setup(t, true)
	var schema string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	other, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lock := maintenance.PartitionsLockName(schema, "outbox")
	var got int
	if err := other.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", lock).Scan(&got); err != nil || got != 1 {
		t.Fatalf("take the lock: %d, %v", got, err)
	}
	before := partitionNames(t, db)
	rep, err := maintenance.Partitions(ctx, db, maintenance.PartitionOptions{Lookahead: 10})
	if err != nil || !rep.Skipped || len(rep.Added) != 0 {
		t.Fatalf("run under another's lock: %+v, %v; want skipped", rep, err)
	}
	if got := partitionNames(t, db); !slices.Equal(got, before) {
		t.Fatalf("a skipped run changed the partitions: %v", got)
	}
	if _, err := other.ExecContext(ctx, "DO RELEASE_LOCK(?)", lock); err != nil {
		t.Fatal(err)
	}
	rep, err = maintenance.Partitions(ctx, db, maintenance.PartitionOptions{Lookahead: 10})
	if err != nil || rep.Skipped || len(rep.Added) != 4 {
		t.Fatalf("run after the lock was released: %+v, %v; want 4 days added", rep, err)
	}
}

// Two runs at the same moment: each either does the work or skips (or
// finds it done); neither fails on the other's partitions, together they add
// each day once, and the table ends with the days wanted.
func TestPartitionsConcurrentRuns(t *testing.T) {
	db, ctx := setup(t, true)
	today := utcToday(t, db)
	reps := make(chan maintenance.PartitionReport, 2)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			rep, err := maintenance.Partitions(ctx, db, maintenance.PartitionOptions{Lookahead: 20})
			reps <- rep
			errs <- err
		}()
	}
	added := 0
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		added += len((<-reps).Added)
	}
	if added != 14 {
		t.Fatalf("the two runs added %d partitions, want 14 between them", added)
	}
	names := partitionNames(t, db)
	if len(names) != 22 || names[20] != dayName(today.AddDate(0, 0, 20)) || names[21] != "pmax" {
		t.Fatalf("partitions %v", names)
	}
}

// A table that is not partitioned is refused, naming the fix.
func TestPartitionsRefusesUnpartitionedTable(t *testing.T) {
	db, ctx := setup(t, false)
	_, err := maintenance.Partitions(ctx, db, maintenance.PartitionOptions{Lookahead: 7})
	if !maintenance.IsRefused(err) || !strings.Contains(err.Error(), "migrate --partitioned") {
		t.Fatalf("unpartitioned table: %v", err)
	}
	_, err = maintenance.Partitions(ctx, db, maintenance.PartitionOptions{Table: "missing"})
	if err == nil || maintenance.IsRefused(err) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing table: %v", err)
	}
}

// The lock name holds the database and table, within MySQL's 64 characters.
func TestPartitionsLockName(t *testing.T) {
	if got := maintenance.PartitionsLockName("shop", "outbox"); got != "outbox-relay:partitions:shop.outbox" {
		t.Errorf("short name: %q", got)
	}
	long := strings.Repeat("d", 64)
	a, b := maintenance.PartitionsLockName(long, "outbox"), maintenance.PartitionsLockName(long, "outbox2")
	if len(a) != 64 || a == b || !strings.HasPrefix(a, "outbox-relay:partitions:") {
		t.Errorf("long names: %q and %q", a, b)
	}
}
