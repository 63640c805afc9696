package relay

import (
	"context"
	"database/sql"
	"regexp"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// privateSetup is setup on a server of the test's own, which it may kill.
func privateSetup(t *testing.T) (*testenv.Server, *testenv.DB, *testenv.Broker) {
	t.Helper()
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	db.Migrate(testenv.Context(t, time.Minute), t)
	return srv, db, testenv.RabbitMQ(t)
}

// waitReceived waits until the validator has seen at least n deliveries.
func waitReceived(ctx context.Context, t *testing.T, v *validator.Validator, n int) {
	t.Helper()
	received := func() int64 { return int64(v.Received()) }
	if err := progress.Wait(ctx, "wait for deliveries", received, func() bool { return v.Received() >= n }); err != nil {
		t.Fatalf("only %d deliveries, waited for %d: %v", v.Received(), n, err)
	}
}

// MariaDB killed with SIGKILL while the relay is publishing a backlog, then
// started again: nothing is lost, first deliveries stay in commit order per
// partition, and what was written after the restart arrives too.
func TestRelaySurvivesMariaDBKill(t *testing.T) {
	t.Parallel()
	srv, db, b := privateSetup(t)
	v := consume(t, b, b.Queue)
	startRelay(t, db, b, nil)
	ctx := testenv.WorkContext(t)

	produce(ctx, t, db, b, v, load{producers: 4, partitions: 40, total: 5_000, bigTxn: 500, bigShare: 0.9})
	waitReceived(ctx, t, v, 500)
	before := v.Received()
	srv.Kill(t)
	t.Logf("killed MariaDB after %d of 5000 deliveries", before)
	srv.Start(t)
	// The writes after the restart go through a pool of their own: the
	// test's pool may still hand out a connection to the killed server (a
	// producer's INSERT once failed with "invalid connection" beside the
	// whole suite, after its idle connections had been dropped).
	after := *db
	after.SQL = db.Pool(t, func(*mysql.Config) {})

	produce(ctx, t, &after, b, v, load{producers: 4, partitions: 40, total: 2_000, bigTxn: 100, bigShare: 0.5})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	if before >= 5_000 {
		t.Fatalf("the kill came after the stream ended (%d deliveries): the test proved nothing", before)
	}
	t.Logf("duplicates after the kill: %d", v.Duplicates())
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
}

// An idle relay queries nothing that touches the outbox table: it learns of
// new rows from the binlog alone. (Leadership heartbeats touch only the
// progress row.)
func TestRelayIdleSendsNoOutboxQuery(t *testing.T) {
	t.Parallel()
	srv, db, b := privateSetup(t)
	root := srv.Root(t)
	ctx := testenv.WorkContext(t)
	for _, q := range []string{"SET GLOBAL log_output = 'TABLE'", "TRUNCATE mysql.general_log", "SET GLOBAL general_log = ON"} {
		if _, err := root.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	startRelay(t, db, b, nil) // returns once the relay tails the binlog
	// The start-up's one query that may run beside tailing is the probe for
	// delayed rows; once it has run, the relay is idle. (The backlog count
	// reads idx_due too: it runs at the start of the term, never while the
	// relay is idle, which the log below would show.)
	if err := pollUntil(ctx, func() bool {
		var n int
		if err := root.QueryRowContext(ctx, "SELECT COUNT(*) FROM mysql.general_log WHERE "+
			"CONVERT(argument USING utf8mb4) LIKE '%available_at IS NOT NULL ORDER BY available_at LIMIT 1%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}); err != nil {
		t.Fatalf("the relay never probed for delayed rows: %v", err)
	}
	if _, err := root.ExecContext(ctx, "TRUNCATE mysql.general_log"); err != nil {
		t.Fatal(err)
	}
	// The idle period is what is under test, so here a fixed wait is the point.
	time.Sleep(10 * time.Second)
	if _, err := root.ExecContext(ctx, "SET GLOBAL general_log = OFF"); err != nil {
		t.Fatal(err)
	}
	queries := generalLog(ctx, t, root)
	for _, q := range outboxStatements(ctx, t, root) {
		t.Errorf("idle relay touched the outbox table: %s", q)
	}
	t.Logf("queries in 10 s of idleness: %d (leadership heartbeats)", len(queries))
}

// generalLog returns the statements of the server's general log (a table).
func generalLog(ctx context.Context, t *testing.T, root *sql.DB) []string {
	t.Helper()
	rows, err := root.QueryContext(ctx, "SELECT CONVERT(argument USING utf8mb4) FROM mysql.general_log"+
		" WHERE command_type IN ('Query', 'Execute', 'Prepare')")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var q string
		if err := rows.Scan(&q); err != nil {
			t.Fatal(err)
		}
		got = append(got, q)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// outboxStatements returns the statements of the server's general log that
// read or write the outbox table. String literals (lock names such as
// 'outbox-relay-table:…') name no table: they are blanked before the match.
func outboxStatements(ctx context.Context, t *testing.T, root *sql.DB) []string {
	t.Helper()
	touchesOutbox := regexp.MustCompile("(?i)`?\\boutbox\\b`?($|[^_])")
	literal := regexp.MustCompile(`'(?:[^'\\]|\\.)*'`)
	var got []string
	for _, q := range generalLog(ctx, t, root) {
		if touchesOutbox.MatchString(literal.ReplaceAllString(q, "''")) {
			got = append(got, q)
		}
	}
	return got
}
