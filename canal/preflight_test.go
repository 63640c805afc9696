package canal

import (
	"database/sql"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func wantPreflight(t *testing.T, err error, check string) {
	t.Helper()
	var pe *PreflightError
	if !errors.As(err, &pe) || pe.Check != check {
		t.Fatalf("got %v, want a *PreflightError for %s", err, check)
	}
	if strings.Contains(err.Error(), "\n") || pe.Fix == "" {
		t.Fatalf("%q: want one line that names the fix", err)
	}
	t.Logf("%s: %v", check, err)
}

func TestPreflightPasses(t *testing.T) {
	db := testenv.MySQL(t)
	cfg := tailerConfig(t, db)
	if err := Preflight(testCtx(t), db.SQL, cfg); err != nil {
		t.Fatal(err)
	}
	cfg.ServerID = db.Server.ServerID()
	wantPreflight(t, Preflight(testCtx(t), db.SQL, cfg), CheckServerID)
}

func TestPreflightServerIDOfConnectedTailer(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	cfg := tailerConfig(t, db)
	tl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := startRun(t, tl, currentPosition(t, db.SQL), &collector{})
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := Preflight(testCtx(t), db.SQL, cfg)
		if err != nil {
			wantPreflight(t, err, CheckServerID)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Preflight does not see the running tailer's server id")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}

func TestPreflightNoBinlog(t *testing.T) {
	srv := testenv.StartServer(t, testenv.ServerOptions{NoBinlog: true})
	db := srv.CreateDatabase(t)
	wantPreflight(t, Preflight(testCtx(t), db.SQL, tailerConfig(t, db)), CheckLogBin)
}

// TestPreflightSettings changes the binlog settings of a private server one
// at a time. SET GLOBAL affects new sessions, so each check uses a fresh pool.
func TestPreflightSettings(t *testing.T) {
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	root := srv.Root(t)
	db := srv.CreateDatabase(t)
	for _, tc := range []struct{ set, reset, check string }{
		{"SET GLOBAL binlog_format='STATEMENT'", "SET GLOBAL binlog_format='ROW'", CheckFormat},
		{"SET GLOBAL binlog_row_image='MINIMAL'", "SET GLOBAL binlog_row_image='FULL'", CheckRowImage},
		{"SET GLOBAL binlog_row_metadata='MINIMAL'", "SET GLOBAL binlog_row_metadata='FULL'", CheckRowMetadata},
	} {
		t.Run(tc.check, func(t *testing.T) {
			if _, err := root.ExecContext(testCtx(t), tc.set); err != nil {
				t.Fatal(err)
			}
			defer root.ExecContext(testCtx(t), tc.reset)
			wantPreflight(t, Preflight(testCtx(t), db.SQL, tailerConfig(t, db)), tc.check)
		})
	}
	if err := Preflight(testCtx(t), db.SQL, tailerConfig(t, db)); err != nil {
		t.Fatalf("after the resets: %v", err)
	}
}

// createUser makes a user with the given global grants and returns a pool
// logged in as it.
func createUser(t *testing.T, db *testenv.DB, grants string) (*sql.DB, string, string) {
	t.Helper()
	ctx := testCtx(t)
	user := fmt.Sprintf("canal_%d", mrand.N(1_000_000_000))
	pass := "pw-" + user
	stmts := []string{fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", user, pass)}
	if grants != "" {
		stmts = append(stmts, fmt.Sprintf("GRANT %s ON *.* TO '%s'@'%%'", grants, user))
	}
	stmts = append(stmts, fmt.Sprintf("GRANT SELECT ON `%s`.* TO '%s'@'%%'", db.Name, user))
	for _, s := range stmts {
		if _, err := db.SQL.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() { db.SQL.Exec(fmt.Sprintf("DROP USER '%s'@'%%'", user)) })
	dsn := mysql.NewConfig()
	dsn.User, dsn.Passwd, dsn.Net, dsn.Addr, dsn.DBName = user, pass, "tcp", fmt.Sprintf("%s:%d", db.Host, db.Port), db.Name
	pool, err := sql.Open("mysql", dsn.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return pool, user, pass
}

func TestPreflightGrants(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)

	pool, user, pass := createUser(t, db, "REPLICATION CLIENT")
	cfg := tailerConfig(t, db)
	cfg.User, cfg.Password = user, pass
	var grants []string
	rows, err := pool.Query("SHOW GRANTS")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var g string
		rows.Scan(&g)
		grants = append(grants, g)
	}
	rows.Close()
	t.Logf("SHOW GRANTS after GRANT REPLICATION CLIENT: %q", grants)
	wantPreflight(t, Preflight(testCtx(t), pool, cfg), CheckReplSlave)

	// Run as that user fails with an access error, not a retry loop.
	tl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ae *AccessError
	if err := tl.Run(testCtx(t), currentPosition(t, db.SQL), &collector{}); !errors.As(err, &ae) {
		t.Fatalf("Run without REPLICATION SLAVE: %v, want *AccessError", err)
	}

	pool, user, pass = createUser(t, db, "REPLICATION SLAVE")
	cfg.User, cfg.Password = user, pass
	wantPreflight(t, Preflight(testCtx(t), pool, cfg), CheckReplClient)

	pool, user, pass = createUser(t, db, "REPLICATION SLAVE, BINLOG MONITOR")
	cfg.User, cfg.Password = user, pass
	if err := Preflight(testCtx(t), pool, cfg); err != nil {
		t.Fatalf("with both grants: %v", err)
	}
}
