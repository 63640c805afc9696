package testenv_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func scalar(t *testing.T, db interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, query string, args ...any) string {
	t.Helper()
	var v sql.NullString
	if err := db.QueryRowContext(ctx(t), query, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return v.String
}

func mustExec(t *testing.T, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(ctx(t), query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func TestServerBinlogSettingsAndRestart(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := testenv.StartServer(t, testenv.ServerOptions{})
	t.Logf("private server up in %v on %s (server id %d)", time.Since(start), s.Addr(), s.ServerID())

	for variable, want := range map[string]string{
		"@@log_bin":              "1",
		"@@binlog_format":        "ROW",
		"@@binlog_row_image":     "FULL",
		"@@binlog_row_metadata":  "FULL",
		"@@gtid_strict_mode":     "1",
		"@@log_slave_updates":    "1",
		"@@character_set_server": "utf8mb4",
		"@@server_id":            strconv.FormatUint(uint64(s.ServerID()), 10),
	} {
		if got := scalar(t, s.Root(t), "SELECT "+variable); got != want {
			t.Errorf("%s = %q, want %q", variable, got, want)
		}
	}

	db := s.CreateDatabase(t)
	if db.Server != s || db.Port != s.Port() || db.Host != "127.0.0.1" || db.User != "root" {
		t.Fatalf("DB fields: %+v", db)
	}
	mustExec(t, db.SQL, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10)) ENGINE=InnoDB; INSERT INTO t VALUES (1, 'before')")

	for i := range 2 { // Kill and Start must work repeatedly
		s.Kill(t)
		if err := db.SQL.PingContext(ctx(t)); err == nil {
			t.Fatal("ping after Kill succeeded")
		}
		start := time.Now()
		s.Start(t)
		t.Logf("restart %d after kill -9 took %v", i+1, time.Since(start))
		if got := scalar(t, db.SQL, "SELECT v FROM t WHERE id = 1"); got != "before" {
			t.Fatalf("row after restart: %q", got)
		}
		mustExec(t, db.SQL, "INSERT INTO t VALUES (?, 'after')", 10+i)
	}
	s.Stop(t)
	s.Start(t)
	if got := scalar(t, db.SQL, "SELECT COUNT(*) FROM t"); got != "3" {
		t.Fatalf("rows after clean restart: %s", got)
	}
}

func TestServerNoBinlogAndExtraArgs(t *testing.T) {
	t.Parallel()
	s := testenv.StartServer(t, testenv.ServerOptions{NoBinlog: true, ServerID: 4242, ExtraArgs: []string{"--binlog-format=STATEMENT"}})
	root := s.Root(t)
	if got := scalar(t, root, "SELECT @@log_bin"); got != "0" {
		t.Errorf("log_bin = %s", got)
	}
	if got := scalar(t, root, "SELECT @@binlog_format"); got != "STATEMENT" {
		t.Errorf("binlog_format = %s", got)
	}
	if got := scalar(t, root, "SELECT @@server_id"); got != "4242" || s.ServerID() != 4242 {
		t.Errorf("server_id = %s, ServerID() = %d", got, s.ServerID())
	}
}

func TestPurgeBinlogs(t *testing.T) {
	t.Parallel()
	s := testenv.StartServer(t, testenv.ServerOptions{})
	db := s.CreateDatabase(t)
	mustExec(t, db.SQL, "CREATE TABLE t (id INT PRIMARY KEY)")
	root := s.Root(t)
	for i := range 3 {
		mustExec(t, db.SQL, "INSERT INTO t VALUES (?)", i)
		mustExec(t, root, "FLUSH BINARY LOGS")
	}
	if n := len(binlogs(t, root)); n < 4 {
		t.Fatalf("expected at least 4 binlog files before purge, got %d", n)
	}
	s.PurgeBinlogs(t)
	files := binlogs(t, root)
	if len(files) != 1 {
		t.Fatalf("binlogs after purge: %v", files)
	}
	if got := scalar(t, root, "SELECT @@log_bin_basename"); !strings.HasSuffix(got, "mariadb-bin") {
		t.Errorf("log_bin_basename = %s", got)
	}
}

func binlogs(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.QueryContext(ctx(t), "SHOW BINARY LOGS")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var files []string
	for rows.Next() {
		vals := make([]any, len(cols))
		var name string
		vals[0] = &name
		for i := 1; i < len(cols); i++ {
			vals[i] = new(sql.RawBytes)
		}
		if err := rows.Scan(vals...); err != nil {
			t.Fatal(err)
		}
		files = append(files, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return files
}

func TestReplicaAndPromote(t *testing.T) {
	t.Parallel()
	primary := testenv.StartServer(t, testenv.ServerOptions{})
	db := primary.CreateDatabase(t)
	mustExec(t, db.SQL, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10)); INSERT INTO t VALUES (1, 'one')")

	replica := primary.StartReplica(t)
	if replica.ServerID() == primary.ServerID() {
		t.Fatal("replica has the primary's server id")
	}
	rroot := replica.Root(t)
	if got := scalar(t, rroot, "SELECT v FROM "+db.Name+".t WHERE id = 1"); got != "one" {
		t.Fatalf("replica row 1: %q", got)
	}
	mustExec(t, db.SQL, "INSERT INTO t VALUES (2, 'two')")
	primary.WaitReplicaCaughtUp(t, replica)
	if got := scalar(t, rroot, "SELECT v FROM "+db.Name+".t WHERE id = 2"); got != "two" {
		t.Fatalf("replica row 2: %q", got)
	}
	if got := scalar(t, rroot, "SELECT @@read_only"); got != "1" {
		t.Fatalf("replica read_only = %s", got)
	}
	primaryPos := scalar(t, primary.Root(t), "SELECT @@gtid_binlog_pos")
	if got := scalar(t, rroot, "SELECT @@gtid_binlog_pos"); got == "" {
		t.Fatalf("replica logs no replicated transactions (primary at %s)", primaryPos)
	}

	replica.Promote(t)
	if got := scalar(t, rroot, "SELECT @@read_only"); got != "0" {
		t.Fatalf("promoted read_only = %s", got)
	}
	// A user without SUPER is what read_only stops.
	mustExec(t, rroot, "CREATE USER app@'127.0.0.1'; GRANT ALL ON "+db.Name+".* TO app@'127.0.0.1'")
	app, err := sql.Open("mysql", "app@tcp("+replica.Addr()+")/"+db.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	mustExec(t, app, "INSERT INTO t VALUES (3, 'three')")
	var status sql.NullString
	err = rroot.QueryRowContext(ctx(t), "SHOW SLAVE STATUS").Scan(&status)
	if !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("SHOW SLAVE STATUS after Promote: %v", err)
	}
}
