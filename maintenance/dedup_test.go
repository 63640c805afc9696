package maintenance_test

import (
	"database/sql"
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/maintenance"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func insertDedup(t *testing.T, db *sql.DB, consumer string, ago time.Duration) string {
	t.Helper()
	id := newID(t)
	exec(t, db, `INSERT INTO message_deduplication (consumer, message_id, message_name, processed_at)
		VALUES (?, ?, 'order.placed', UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)`, consumer, id[:], ago.Microseconds())
	return consumer + "/" + id.String()
}

func dedupKeys(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query("SELECT consumer, message_id FROM message_deduplication")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c string
		var raw []byte
		if err := rows.Scan(&c, &raw); err != nil {
			t.Fatal(err)
		}
		var id outbox.MessageID
		copy(id[:], raw)
		out = append(out, c+"/"+id.String())
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// An age below the floor is refused without Force and deletes nothing;
// with Force, or at the floor, records older than the age go, batch by
// batch, and younger ones stay. --consumer limits it to one consumer's
// records (consumer names are compared byte for byte, and ” is a consumer
// like any other: the one rows from before the consumer column got).
func TestDedupCleanup(t *testing.T) {
	db, ctx := setup(t, false)
	var keep []string
	for i := range 7 {
		insertDedup(t, db, "billing", 30*day+time.Duration(i)*time.Second)
		keep = append(keep, insertDedup(t, db, "Billing", 30*day)) // another consumer
		keep = append(keep, insertDedup(t, db, "billing", 2*day))
	}
	keep = append(keep, insertDedup(t, db, "", 30*day))
	slices.Sort(keep)
	billing := "billing"

	_, err := maintenance.DedupCleanup(ctx, db, maintenance.DedupCleanupOptions{OlderThan: day, Consumer: &billing})
	if !maintenance.IsRefused(err) || count(t, db, "SELECT COUNT(*) FROM message_deduplication") != 22 {
		t.Fatalf("below the floor: %v, want a refusal and nothing deleted", err)
	}
	// A raised floor refuses an age the default accepts.
	res, err := maintenance.DedupCleanup(ctx, db, maintenance.DedupCleanupOptions{OlderThan: 20 * day, Consumer: &billing, Floor: 30 * day})
	if !maintenance.IsRefused(err) {
		t.Fatalf("below a raised floor: %+v, %v; want a refusal", res, err)
	}

	res, err = maintenance.DedupCleanup(ctx, db, maintenance.DedupCleanupOptions{OlderThan: 7 * day, Consumer: &billing, DryRun: true})
	if err != nil || res.Rows != 7 || count(t, db, "SELECT COUNT(*) FROM message_deduplication") != 22 {
		t.Fatalf("dry run: %+v, %v; want 7 counted, nothing deleted", res, err)
	}
	res, err = maintenance.DedupCleanup(ctx, db, maintenance.DedupCleanupOptions{OlderThan: 7 * day, Consumer: &billing,
		Batch: maintenance.Batch{Size: 2}})
	if err != nil || res.Rows != 7 || res.Batches != 4 {
		t.Fatalf("cleanup: %+v, %v; want 7 rows in 4 batches", res, err)
	}
	if got := dedupKeys(t, db); !slices.Equal(got, keep) {
		t.Fatalf("left %v\nwant %v", got, keep)
	}

	// Force accepts an age below the floor (a dry run here: it would
	// delete every record)...
	res, err = maintenance.DedupCleanup(ctx, db, maintenance.DedupCleanupOptions{OlderThan: day, Force: true, DryRun: true})
	if err != nil || res.Rows != 15 {
		t.Fatalf("forced dry run: %+v, %v; want 15 rows", res, err)
	}
	// ... and so does a lowered floor. Every consumer: only the 2-day-old
	// records stay.
	res, err = maintenance.DedupCleanup(ctx, db, maintenance.DedupCleanupOptions{OlderThan: 3 * day, Floor: 3 * day})
	if err != nil || res.Rows != 8 {
		t.Fatalf("cleanup with a lowered floor: %+v, %v; want 8 rows", res, err)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM message_deduplication WHERE consumer = 'billing'"); n != 7 ||
		count(t, db, "SELECT COUNT(*) FROM message_deduplication") != 7 {
		t.Fatalf("after the forced cleanup: %v", dedupKeys(t, db))
	}
}

// Many records sharing one processed_at (a bulk insert) are all deleted,
// across batches.
func TestDedupCleanupSameTimestamp(t *testing.T) {
	db, ctx := setup(t, false)
	for range 25 {
		id := newID(t)
		exec(t, db, `INSERT INTO message_deduplication (consumer, message_id, message_name, processed_at)
			VALUES ('c', ?, '', '2020-01-01 00:00:00')`, id[:])
	}
	res, err := maintenance.DedupCleanup(ctx, db, maintenance.DedupCleanupOptions{OlderThan: 7 * day, Batch: maintenance.Batch{Size: 10}})
	if err != nil || res.Rows != 25 || count(t, db, "SELECT COUNT(*) FROM message_deduplication") != 0 {
		t.Fatalf("cleanup: %+v, %v; want all 25 deleted", res, err)
	}
}
