package canal

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/mysqldouble"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// The tailer on MySQL-shaped streams: internal/mysqldouble serves, over the
// replication protocol, what MySQL 8.0 and 8.4 write (its bytes are
// checked against real MySQL binlogs in mysqldouble_test.go).

var doubleUUID = uuid.MustParse("3e11fa47-71ca-11e1-9e33-c80aa9429562")

func startDouble(t testing.TB, v mysqldouble.Version) *mysqldouble.Server {
	t.Helper()
	srv, err := mysqldouble.Start(mysqldouble.Config{Version: v, User: "relay", Password: "secret", ServerUUID: doubleUUID, ServerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

func doubleConfig(t testing.TB, srv *mysqldouble.Server) Config {
	return Config{
		Host: "127.0.0.1", Port: srv.Port(), User: "relay", Password: "secret",
		ServerID: 77, Flavor: FlavorMySQL, Schema: "app", Table: "outbox",
		HeartbeatPeriod: 100 * time.Millisecond, ReadTimeout: time.Second,
		RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	}
}

func doubleDB(t testing.TB, srv *mysqldouble.Server) *sql.DB {
	t.Helper()
	return doubleDBAs(t, srv, "relay", "secret")
}

// doubleDBAs is a pool on srv logging in as user.
func doubleDBAs(t testing.TB, srv *mysqldouble.Server, user, password string) *sql.DB {
	t.Helper()
	cfg := driver.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr = user, password, "tcp", srv.Addr()
	c, err := driver.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

var outboxTable = mysqldouble.Table{ID: 90, Schema: "app", Name: "outbox", Columns: mysqldouble.OutboxColumns()}

// outboxRows builds rows ids..ids+n-1 in OutboxColumns order, each with a
// partition key of its own parity.
func outboxRows(first uint64, n int) [][]any {
	created := time.Date(2025, 3, 4, 5, 6, 7, 891234000, time.UTC)
	var rows [][]any
	for id := first; id < first+uint64(n); id++ {
		mid := fmt.Sprintf("%016d", id)
		rows = append(rows, []any{id, mid, fmt.Sprintf("key-%d", id%2), "ex", "rk." + fmt.Sprint(id), "order.placed",
			map[string]string{"tenant": "t1"}, []byte("payload \x00 " + fmt.Sprint(id)), "application/json",
			created, nil, nil, uint32(0), nil})
	}
	return rows
}

// waitMySQL waits until c's last commit has reached end.
func waitMySQL(t *testing.T, r *running, c *collector, end position.Position) {
	t.Helper()
	err := progress.Wait(testenv.WorkContext(t), "commits reach "+end.String(),
		func() int64 { _, txns := c.snapshot(); return int64(len(txns)) },
		func() bool {
			if err, ok := r.exited(); ok {
				t.Fatalf("Run returned early: %v", err)
			}
			p, ok := c.lastPos()
			if !ok {
				return false
			}
			done, err := position.Reached(p, end)
			if err != nil {
				t.Fatal(err)
			}
			return done
		})
	if err != nil {
		t.Fatal(err)
	}
}

func commit(t testing.TB, srv *mysqldouble.Server, txn mysqldouble.Txn) string {
	t.Helper()
	g, err := srv.Commit(txn)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestMySQLDoubleStream: on MySQL 8.0 and 8.4 streams, every outbox row
// arrives once, in order, with its values, through plain and zstd-
// compressed transactions (compression turned on mid-stream), tagged
// GTIDs, a rotate, heartbeats, a foreign table and a DDL; commits carry
// UUID GTID sets; a dropped connection resumes without repeats; a restart
// from the last commit delivers only what follows.
func TestMySQLDoubleStream(t *testing.T) {
	for _, v := range []mysqldouble.Version{mysqldouble.MySQL80, mysqldouble.MySQL84} {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			srv := startDouble(t, v)
			foreign := mysqldouble.Table{ID: 91, Schema: "app", Name: "orders", Columns: mysqldouble.OutboxColumns()}
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(1, 2)})
			commit(t, srv, mysqldouble.Txn{Table: foreign, Rows: outboxRows(100, 1)})
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Query: "ALTER TABLE orders ADD COLUMN x INT"})
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(3, 1), Tag: "relay"})
			srv.Rotate()
			// SET SESSION binlog_transaction_compression=ON from here on.
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(4, 3), Compressed: true})
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(7, 2), Compressed: true, Tag: "relay"})

			tl, err := New(doubleConfig(t, srv))
			if err != nil {
				t.Fatal(err)
			}
			c := &collector{}
			r := startRun(t, tl, position.Position{Flavor: FlavorMySQL}, c)
			end := position.Position{Flavor: FlavorMySQL, GTIDSet: srv.Executed()}
			waitMySQL(t, r, c, end)
			if end.GTIDSet != doubleUUID.String()+":1-4:relay:1-2" {
				t.Fatalf("executed %s", end.GTIDSet)
			}

			// A cut connection; the stream resumes after the last commit.
			srv.DropConnections()
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(9, 2), Compressed: true})
			end = position.Position{Flavor: FlavorMySQL, GTIDSet: srv.Executed()}
			waitMySQL(t, r, c, end)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			recs, txns := c.snapshot()
			checkMySQLRecords(t, recs, 1, 10)
			wantRows := []int{2, 0, 0, 1, 3, 2, 2}
			if len(txns) != len(wantRows) {
				t.Fatalf("%d commits, want %d: %+v", len(txns), len(wantRows), txns)
			}
			for i, tx := range txns {
				if tx.rows != wantRows[i] || tx.pos.Flavor != FlavorMySQL {
					t.Errorf("commit %d: %+v, want %d rows", i, tx, wantRows[i])
				}
			}
			if last := txns[len(txns)-1].pos; last.GTIDSet != end.GTIDSet || last.File != "binlog.000002" {
				t.Errorf("last commit %+v, want %s in binlog.000002", last, end.GTIDSet)
			}

			// Restart from the stored position: only what follows arrives.
			from := txns[len(txns)-1].pos
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(11, 1), Tag: "relay"})
			c2 := &collector{}
			r2 := startRun(t, tl, from, c2)
			end = position.Position{Flavor: FlavorMySQL, GTIDSet: srv.Executed()}
			waitMySQL(t, r2, c2, end)
			if err := r2.stop(); err != nil {
				t.Fatal(err)
			}
			recs, txns = c2.snapshot()
			checkMySQLRecords(t, recs, 11, 11)
			if len(txns) != 1 || txns[0].pos.GTIDSet != doubleUUID.String()+":1-5:relay:1-3" {
				t.Fatalf("after restart: %+v", txns)
			}
		})
	}
}

// checkMySQLRecords checks recs are ids first..last once, in order, with
// the values outboxRows wrote.
func checkMySQLRecords(t *testing.T, recs []*outbox.Record, first, last uint64) {
	t.Helper()
	if len(recs) != int(last-first+1) {
		t.Fatalf("%d rows, want %d (ids %d-%d): %v", len(recs), last-first+1, first, last, ids(recs))
	}
	for i, rec := range recs {
		id := first + uint64(i)
		want := outboxRows(id, 1)[0]
		if rec.ID != id || string(rec.MessageID[:]) != want[1].(string) || rec.PartitionKey != want[2] ||
			rec.Exchange != "ex" || rec.RoutingKey != want[4] || rec.MessageType != "order.placed" ||
			string(rec.Payload) != string(want[7].([]byte)) || rec.ContentType != "application/json" ||
			!rec.CreatedAt.Equal(want[9].(time.Time)) || !rec.AvailableAt.IsZero() {
			t.Errorf("row %d: %+v", i, rec)
		}
		if h := strings.ReplaceAll(string(rec.Headers), " ", ""); h != `{"tenant":"t1"}` {
			t.Errorf("row %d headers %q", i, rec.Headers)
		}
	}
}

// TestMySQLDoubleColumnNames: the tailer maps values by the TABLE_MAP's
// names. A table whose columns were reordered (same count) still yields
// right values; one whose column was renamed is refused with a
// *SchemaError naming the column and the table map's names, and nothing of
// that transaction is handed on.
func TestMySQLDoubleColumnNames(t *testing.T) {
	t.Parallel()
	srv := startDouble(t, mysqldouble.MySQL84)
	swapped := outboxTable
	swapped.Columns = append([]mysqldouble.Column(nil), outboxTable.Columns...)
	swapped.Columns[3], swapped.Columns[4] = swapped.Columns[4], swapped.Columns[3] // routing_key before exchange
	rows := outboxRows(1, 1)
	rows[0][3], rows[0][4] = rows[0][4], rows[0][3]
	commit(t, srv, mysqldouble.Txn{Table: swapped, Rows: rows, Compressed: true})
	renamed := outboxTable
	renamed.Columns = append([]mysqldouble.Column(nil), outboxTable.Columns...)
	renamed.Columns[4].Name = "route" // ALTER TABLE outbox RENAME COLUMN routing_key TO route
	commit(t, srv, mysqldouble.Txn{Table: renamed, Rows: outboxRows(2, 1)})

	tl, err := New(doubleConfig(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	err = tl.Run(testenv.WorkContext(t), position.Position{Flavor: FlavorMySQL}, c)
	var se *SchemaError
	if !errors.As(err, &se) || se.Column != "routing_key" || !strings.Contains(strings.Join(se.Columns, ","), "route") ||
		!strings.Contains(err.Error(), doubleUUID.String()+":2") {
		t.Fatalf("want a SchemaError for routing_key in transaction %s:2, got %v", doubleUUID, err)
	}
	recs, txns := c.snapshot()
	checkMySQLRecords(t, recs, 1, 1)
	if len(txns) != 1 {
		t.Fatalf("commits %+v", txns)
	}
}

// TestMySQLDoubleStatements: the preflight and the position reads on
// MySQL 8.0 and 8.4 answers (8.4 refuses SHOW MASTER STATUS and SHOW SLAVE
// HOSTS; 8.0 does not know SHOW BINARY LOG STATUS).
func TestMySQLDoubleStatements(t *testing.T) {
	for _, v := range []mysqldouble.Version{mysqldouble.MySQL80, mysqldouble.MySQL84} {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			srv := startDouble(t, v)
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(1, 1)})
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(2, 1), Tag: "relay"})
			db := doubleDB(t, srv)
			ctx := testenv.WorkContext(t)
			cfg := doubleConfig(t, srv)
			if err := Preflight(ctx, db, cfg); err != nil {
				t.Fatalf("preflight: %v", err)
			}
			if fl, err := DetectFlavor(ctx, db); err != nil || fl != FlavorMySQL {
				t.Fatalf("flavor %q %v", fl, err)
			}
			want := doubleUUID.String() + ":1:relay:1"
			cur, err := CurrentPosition(ctx, db)
			if err != nil || cur.GTIDSet != want || cur.Flavor != FlavorMySQL {
				t.Fatalf("current position %+v %v", cur, err)
			}
			if ex, err := ExecutedGTIDs(ctx, db, FlavorMySQL); err != nil || ex != want {
				t.Fatalf("executed %q %v", ex, err)
			}
			snap, err := SnapshotPosition(ctx, db)
			if err != nil || snap.GTIDSet != want {
				t.Fatalf("snapshot position %+v %v", snap, err)
			}
			if err := CheckPosition(ctx, db, cur); err != nil {
				t.Fatalf("check position: %v", err)
			}
			var pe *PurgedError
			ahead := position.Position{Flavor: FlavorMySQL, GTIDSet: doubleUUID.String() + ":1-9"}
			if err := CheckPosition(ctx, db, ahead); !errors.As(err, &pe) {
				t.Fatalf("position ahead of the server: %v", err)
			}
			if err := srv.SetPurged(doubleUUID.String() + ":1"); err != nil {
				t.Fatal(err)
			}
			behind := position.Position{Flavor: FlavorMySQL, GTIDSet: doubleUUID.String() + ":relay:1"}
			if err := CheckPosition(ctx, db, behind); !errors.As(err, &pe) {
				t.Fatalf("position behind the purged set: %v", err)
			}
			// The dump refuses it too, as MySQL does: a *PurgedError from Run.
			tl, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := tl.Run(ctx, behind, &collector{}); !errors.As(err, &pe) {
				t.Fatalf("run from a purged position: %v", err)
			}
		})
	}
}

// TestMySQLDoubleFileMode: a MySQL with gtid_mode=OFF writes anonymous
// GTIDs; the current position is a file and offset (8.4: SHOW BINARY LOG
// STATUS; 8.0: SHOW MASTER STATUS), the snapshot position too
// (performance_schema.log_status), and the tailer streams by file offset
// from there, each transaction committed once with a file position.
func TestMySQLDoubleFileMode(t *testing.T) {
	for _, v := range []mysqldouble.Version{mysqldouble.MySQL80, mysqldouble.MySQL84} {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			srv, err := mysqldouble.Start(mysqldouble.Config{Version: v, User: "relay", Password: "secret",
				ServerUUID: doubleUUID, ServerID: 1, GTIDModeOff: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(1, 1)})
			db := doubleDB(t, srv)
			ctx := testenv.WorkContext(t)
			tl, err := New(doubleConfig(t, srv))
			if err != nil {
				t.Fatal(err)
			}
			// A dump by GTID set is refused: a gtid_mode problem, not a purge.
			var pe *PreflightError
			if err := tl.Run(ctx, position.Position{Flavor: FlavorMySQL}, &collector{}); !errors.As(err, &pe) || pe.Check != CheckGTIDMode {
				t.Fatalf("GTID dump on gtid_mode=OFF: %v", err)
			}
			from, err := CurrentPosition(ctx, db)
			if err != nil || from.GTIDSet != "" || from.File != "binlog.000001" || from.Pos == 0 {
				t.Fatalf("current position %+v %v", from, err)
			}
			if snap, err := SnapshotPosition(ctx, db); err != nil || snap != from {
				t.Fatalf("snapshot position %+v %v, want %+v", snap, err, from)
			}
			if err := CheckPosition(ctx, db, from); err != nil {
				t.Fatalf("check position: %v", err)
			}
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(2, 2), Compressed: true})
			srv.Rotate()
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(4, 1)})
			end, err := CurrentPosition(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			c := &collector{}
			r := startRun(t, tl, from, c)
			waitMySQL(t, r, c, end)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			recs, txns := c.snapshot()
			checkMySQLRecords(t, recs, 2, 4)
			if len(txns) != 2 || txns[1].pos != end || txns[0].pos.File != "binlog.000001" {
				t.Fatalf("commits %+v, want the last at %+v", txns, end)
			}
		})
	}
}
