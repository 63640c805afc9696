package maintenance_test

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// setup gives the test a fresh database with the relay's tables (the
// outbox partitioned or not) and a context bounded to a minute.
func setup(t *testing.T, partitioned bool) (*sql.DB, context.Context) {
	t.Helper()
	db := testenv.MySQL(t)
	ctx := testenv.Context(t, time.Minute)
	if _, err := migrations.Apply(ctx, db.SQL, migrations.Options{Partitioned: partitioned}); err != nil {
		t.Fatal(err)
	}
	return db.SQL, ctx
}

func newID(t *testing.T) outbox.MessageID {
	t.Helper()
	u, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	return outbox.MessageID(u)
}

func exec(t *testing.T, db *sql.DB, query string, args ...any) sql.Result {
	t.Helper()
	res, err := db.Exec(query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return res
}

// insertRow inserts an outbox row of key created ago, delivered (marked)
// deliveredAgo ago when deliveredAgo >= 0, and returns its id.
func insertRow(t *testing.T, db *sql.DB, key string, createdAgo, deliveredAgo time.Duration) uint64 {
	t.Helper()
	id := newID(t)
	var delivered any
	if deliveredAgo >= 0 {
		delivered = deliveredAgo.Microseconds()
	}
	res := exec(t, db, `INSERT INTO outbox (message_id, partition_key, routing_key, payload, created_at, delivered_at)
		VALUES (?, ?, 'rk', '{}', UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND,
		IF(? IS NULL, NULL, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND))`,
		id[:], key, createdAgo.Microseconds(), delivered, delivered)
	n, err := res.LastInsertId()
	if err != nil {
		t.Fatal(err)
	}
	return uint64(n)
}

// ids returns the ids of the outbox rows, in order.
func ids(t *testing.T, db *sql.DB, where string) []uint64 {
	t.Helper()
	rows, err := db.Query("SELECT id FROM outbox WHERE " + where + " ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []uint64
	for rows.Next() {
		var id uint64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func count(t *testing.T, db *sql.DB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// failedRow is what insertFailed writes to outbox_failed.
type failedRow struct {
	outboxID              uint64
	id                    outbox.MessageID
	key, exchange, rk, mt string
	headers               any // JSON text or nil
	payload               []byte
	contentType           string
	source                string
	failedAgo             time.Duration
}

func insertFailed(t *testing.T, db *sql.DB, f failedRow) {
	t.Helper()
	if f.source == "" {
		f.source = "relay"
	}
	if f.payload == nil {
		f.payload = []byte("{}")
	}
	if f.contentType == "" {
		f.contentType = "application/json"
	}
	exec(t, db, `INSERT INTO outbox_failed (outbox_id, message_id, partition_key, exchange, routing_key, message_type,
		headers, payload, content_type, created_at, error, source, failed_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6) - INTERVAL 1 DAY, 'exchange not found', ?, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)`,
		f.outboxID, f.id[:], f.key, f.exchange, f.rk, f.mt, f.headers, f.payload, f.contentType, f.source, f.failedAgo.Microseconds())
}
