package operator_test

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/mysqlconn"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// leaderDB is a migrated database and a pool on it that parses times, as the
// relay's does.
func leaderDB(ctx context.Context, t *testing.T) *sql.DB {
	t.Helper()
	return testenv.MySQL(t).Migrate(ctx, t).Pool(t, mysqlconn.UTC)
}
