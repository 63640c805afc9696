package operator_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/migrations"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// leaderDB is a migrated database and a pool on it that parses times, as the
// relay's does.
func leaderDB(ctx context.Context, t *testing.T) *sql.DB {
	t.Helper()
	db := testenv.MySQL(t)
	if _, err := migrations.Apply(ctx, db.SQL, migrations.Options{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	sep := "?"
	if strings.Contains(db.DSN, "?") {
		sep = "&"
	}
	pool, err := sql.Open("mysql", db.DSN+sep+"parseTime=true&loc=UTC&time_zone=%27%2B00%3A00%27")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return pool
}
