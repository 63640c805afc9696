package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// An outbox made by an earlier version, without the poller's indexes, gets
// them from the next migrate, and its rows stay.
func TestApplyAddsMissingIndexes(t *testing.T) {
	db := testenv.MySQL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := migrations.Apply(ctx, db.SQL, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"ALTER TABLE outbox DROP INDEX idx_head, DROP INDEX idx_due",
		"INSERT INTO outbox (message_id, routing_key, payload) VALUES (UNHEX(REPEAT('ab', 16)), 'k', 'x')",
	} {
		if _, err := db.SQL.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	applied, err := migrations.Apply(ctx, db.SQL, migrations.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 1 || applied[0] != "0002_outbox_indexes:outbox" {
		t.Fatalf("applied %v, want the index step alone", applied)
	}
	var n int
	if err := db.SQL.QueryRowContext(ctx, `SELECT COUNT(DISTINCT index_name) FROM information_schema.STATISTICS
		WHERE table_schema = DATABASE() AND table_name = 'outbox' AND index_name IN ('idx_head', 'idx_due')`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("indexes idx_head and idx_due present: %d, %v", n, err)
	}
	if err := db.SQL.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after migrate: %d, %v; want the 1 row kept", n, err)
	}
	if applied, err := migrations.Apply(ctx, db.SQL, migrations.Options{}); err != nil || len(applied) != 0 {
		t.Fatalf("third migrate applied %v, %v; want nothing", applied, err)
	}
}
