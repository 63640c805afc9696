package relay

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// tableUser creates a relay user whose rights on db's tables are granted
// table by table (a table-level REVOKE then takes effect on the next
// statement of every open connection) and returns its DSN.
func tableUser(ctx context.Context, t *testing.T, root *sql.DB, srv *testenv.Server, dbName string) string {
	t.Helper()
	rows, err := root.QueryContext(ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = ?", dbName)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, name)
	}
	rows.Close()
	stmts := []string{
		"CREATE USER 'relay'@'127.0.0.1' IDENTIFIED BY 'relay-secret'",
		"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'relay'@'127.0.0.1'",
	}
	for _, tb := range tables {
		stmts = append(stmts, fmt.Sprintf("GRANT ALL ON `%s`.`%s` TO 'relay'@'127.0.0.1'", dbName, tb))
	}
	for _, q := range stmts {
		if _, err := root.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return fmt.Sprintf("relay:relay-secret@tcp(%s)/%s", srv.Addr(), dbName)
}

// An auto relay reading the binlog loses its position to a purge while its
// acknowledgements fail (DELETE on the outbox revoked): the stream stops
// with a purged position and the final acknowledgement before the switch to
// poll mode fails too. The relay must not exit: it goes on (here: restarts
// the term, finds the position purged, polls), and once the grant is back
// every message arrives and the outbox empties.
func TestPurgedPositionAndFailedFinalAckKeepRunning(t *testing.T) {
	t.Parallel()
	srv, db, b := privateSetup(t)
	root := srv.Root(t)
	ctx := testenv.WorkContext(t)
	dsn := tableUser(ctx, t, root, srv, db.Name)
	proxy := testenv.Proxy(t, srv.Addr())
	v := consume(t, b, b.Queue)
	m := newModes()
	rr := runRelay(t, Config{
		MySQLDSN: dsn, AMQPURL: b.URL, DefaultExchange: b.Exchange, CheckpointInterval: time.Second,
		FallbackAfter: time.Hour, BinlogRetryInterval: 500 * time.Millisecond, OnMode: m.hook,
	}, func(r *Relay) {
		// The binlog connection alone goes through the proxy.
		r.canal.Host, r.canal.Port = "127.0.0.1", portOf(t, proxy.Addr())
		r.canal.RetryMin, r.canal.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	})
	// Tailing past the first-start handover: the next acknowledgements
	// store binlog mode, so a new term resumes from the stored position.
	waitMode(ctx, t, m, rr, ModeBinlog)
	waitFor(ctx, t, rr, "tailing the binlog", rr.r.Tailing)
	produce(ctx, t, db, b, v, load{producers: 2, partitions: 10, total: 100, bigTxn: 10, bigShare: 0.2})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)

	// Acknowledgements fail from now on; these rows are published, not acknowledged.
	revoke := fmt.Sprintf("REVOKE DELETE ON `%s`.`outbox` FROM 'relay'@'127.0.0.1'", db.Name)
	if _, err := root.ExecContext(ctx, revoke); err != nil {
		t.Fatal(err)
	}
	produce(ctx, t, db, b, v, load{producers: 2, partitions: 10, total: 50, bigTxn: 10, bigShare: 0.2})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}

	// The binlog connection refused; more transactions; their binlog purged.
	proxy.Disable()
	produce(ctx, t, db, b, v, load{producers: 2, partitions: 10, total: 50, bigTxn: 10, bigShare: 0.2})
	srv.PurgeBinlogs(t)
	proxy.Enable()

	// The reconnect finds the position purged; the final acknowledgement
	// before polling fails. The relay keeps going and polls.
	waitMode(ctx, t, m, rr, ModePoll)
	grant := fmt.Sprintf("GRANT DELETE ON `%s`.`outbox` TO 'relay'@'127.0.0.1'", db.Name)
	if _, err := root.ExecContext(ctx, grant); err != nil {
		t.Fatal(err)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rr.done:
		t.Fatalf("relay exited: %v", rr.err)
	default:
	}
}
