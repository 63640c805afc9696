package canal

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestSchemaChangeStopsRun(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	ctx := testCtx(t)
	tl, err := New(tailerConfig(t, db))
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	r := startRun(t, tl, currentPosition(t, db.SQL), c)
	if err := insertRecords(ctx, db.SQL, newRecords(1)); err != nil {
		t.Fatal(err)
	}
	waitCovered(t, r, c, currentPosition(t, db.SQL), 30*time.Second)

	for _, q := range []string{
		"ALTER TABLE outbox RENAME COLUMN routing_key TO rk",
		"INSERT INTO outbox (message_id, rk, payload) VALUES (UNHEX('aa'), 'k', 'p')",
	} {
		if _, err := db.SQL.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not stop on the schema change")
	}
	var se *SchemaError
	if !errors.As(r.err, &se) || se.Column != "routing_key" || !strings.Contains(r.err.Error(), "routing_key") {
		t.Fatalf("Run returned %v, want a *SchemaError naming routing_key", r.err)
	}
	t.Log(r.err)
	if got, _ := c.snapshot(); len(got) != 1 {
		t.Fatalf("%d rows before the change, want 1", len(got))
	}
}

// TestRowMetadataMinimalStopsRun: a TABLE_MAP without column names
// (binlog_row_metadata=MINIMAL, a global-only setting) is named as such.
func TestRowMetadataMinimalStopsRun(t *testing.T) {
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	setupOutbox(t, db)
	ctx := testCtx(t)
	tl, err := New(tailerConfig(t, db))
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	r := startRun(t, tl, currentPosition(t, db.SQL), c)
	if _, err := db.SQL.ExecContext(ctx, "SET GLOBAL binlog_row_metadata='MINIMAL'"); err != nil {
		t.Fatal(err)
	}
	if err := insertRecords(ctx, db.SQL, newRecords(1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not stop")
	}
	var pe *PreflightError
	if !errors.As(r.err, &pe) || pe.Check != CheckRowMetadata {
		t.Fatalf("Run returned %v, want a *PreflightError for binlog_row_metadata", r.err)
	}
	t.Log(r.err)
}
