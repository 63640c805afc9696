package maintenance_test

import (
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/maintenance"
)

const day = 24 * time.Hour

// Cleanup deletes the rows marked delivered before the cutoff, in batches
// of the given size, and nothing else: pending rows (however old) and rows
// delivered after the cutoff stay. The dry run counts the same rows and
// deletes none.
func TestCleanupDeliveredDeletesOnlyOldDeliveredRows(t *testing.T) {
	db, ctx := setup(t, false)
	var old, keep []uint64
	for i := range 10 {
		old = append(old, insertRow(t, db, "k", 20*day, 10*day+time.Duration(i)*time.Minute))
		keep = append(keep, insertRow(t, db, "k", 20*day, -1))  // pending, old
		keep = append(keep, insertRow(t, db, "k", 20*day, day)) // delivered recently
	}
	keep = append(keep, insertRow(t, db, "", 0, -1))
	slices.Sort(keep)

	res, err := maintenance.CleanupDelivered(ctx, db, maintenance.CleanupOptions{OlderThan: 7 * day, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != 10 || res.Batches != 0 || count(t, db, "SELECT COUNT(*) FROM outbox") != 31 {
		t.Fatalf("dry run: %+v, %d rows left; want 10 rows counted, all 31 left", res, count(t, db, "SELECT COUNT(*) FROM outbox"))
	}

	var progress []int64
	res, err = maintenance.CleanupDelivered(ctx, db, maintenance.CleanupOptions{OlderThan: 7 * day,
		Batch: maintenance.Batch{Size: 3, Progress: func(n int64) { progress = append(progress, n) }}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != 10 || res.Batches != 4 || !slices.Equal(progress, []int64{3, 6, 9, 10}) {
		t.Fatalf("cleanup: %+v, progress %v; want 10 rows in 4 batches (3, 6, 9, 10)", res, progress)
	}
	if got := ids(t, db, "TRUE"); !slices.Equal(got, keep) {
		t.Fatalf("rows left %v, want %v", got, keep)
	}
	if age := time.Since(res.Cutoff); age < 7*day-time.Minute || age > 7*day+time.Minute {
		t.Fatalf("cutoff %v is not 7 days ago", res.Cutoff)
	}

	// Nothing left to do: a second run deletes nothing.
	if res, err = maintenance.CleanupDelivered(ctx, db, maintenance.CleanupOptions{OlderThan: 7 * day}); err != nil || res.Rows != 0 {
		t.Fatalf("second cleanup: %+v, %v", res, err)
	}
}

// The same on a partitioned outbox table, whose primary key is (id,
// created_at).
func TestCleanupDeliveredPartitioned(t *testing.T) {
	db, ctx := setup(t, true)
	a := insertRow(t, db, "k", 0, 10*day)
	b := insertRow(t, db, "k", 0, -1)
	c := insertRow(t, db, "k", 0, 10*day)
	res, err := maintenance.CleanupDelivered(ctx, db, maintenance.CleanupOptions{OlderThan: 7 * day, Batch: maintenance.Batch{Size: 1}})
	if err != nil || res.Rows != 2 {
		t.Fatalf("cleanup: %+v, %v; want 2 rows (%d and %d)", res, err, a, c)
	}
	if got := ids(t, db, "TRUE"); !slices.Equal(got, []uint64{b}) {
		t.Fatalf("rows left %v, want [%d]", got, b)
	}
}

func TestCleanupRefusesBadInput(t *testing.T) {
	db, ctx := setup(t, false)
	for _, o := range []maintenance.CleanupOptions{
		{OlderThan: -time.Hour},
		{OlderThan: time.Hour, Table: "out box"},
		{OlderThan: time.Hour, Batch: maintenance.Batch{Size: maintenance.MaxBatchSize + 1}},
	} {
		if _, err := maintenance.CleanupDelivered(ctx, db, o); !maintenance.IsRefused(err) {
			t.Errorf("%+v: %v, want a refusal", o, err)
		}
	}
}
