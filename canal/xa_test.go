package canal

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// xaPrepare runs an XA transaction up to its PREPARE on its own connection:
// it inserts recs into the outbox and a row into the foreign table.
// It returns the connection, on which the transaction stays until it is
// decided or the connection closes.
func xaPrepare(t *testing.T, db *sql.DB, xid string, recs []*outbox.Record) *sql.Conn {
	t.Helper()
	ctx := testCtx(t)
	c := writer(t, db)
	stmts := []func() error{
		func() error { _, err := c.ExecContext(ctx, "XA START '"+xid+"'"); return err },
		func() error {
			if len(recs) == 0 {
				return nil
			}
			return insertRecords(ctx, c, recs)
		},
		func() error { _, err := c.ExecContext(ctx, "INSERT INTO other (v) VALUES ('"+xid+"')"); return err },
		func() error { _, err := c.ExecContext(ctx, "XA END '"+xid+"'"); return err },
		func() error { _, err := c.ExecContext(ctx, "XA PREPARE '"+xid+"'"); return err },
	}
	for i, f := range stmts {
		if err := f(); err != nil {
			t.Fatalf("XA %s step %d: %v", xid, i, err)
		}
	}
	return c
}

func xaDecide(t *testing.T, db execer, verb, xid string) {
	t.Helper()
	if _, err := db.ExecContext(testCtx(t), "XA "+verb+" '"+xid+"'"); err != nil {
		t.Fatalf("XA %s %s: %v", verb, xid, err)
	}
}

// tailFromNow runs a tailer of db's outbox from the server's current
// position into a collector.
func tailFromNow(t *testing.T, db *testenv.DB) (*running, *collector) {
	t.Helper()
	tl, err := New(tailerConfig(t, db))
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	return startRun(t, tl, currentPosition(t, db.SQL), c), c
}

// disconnect closes c's connection to the server (a transaction manager's
// process that went away).
func disconnect(c *sql.Conn) {
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
	c.Close()
}

// waitExit waits for Run to return (it must, on the event under test).
func waitExit(t *testing.T, r *running) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not stop")
		return nil
	}
}

// TestXARowsHeldUntilCommit: the outbox rows of an XA transaction reach the
// handler never: at its PREPARE the position moves on without them, an XA
// ROLLBACK is read past, and its XA COMMIT stops Run with an
// *XACommitError naming the rows (the caller reads them from the table). An
// XA transaction without outbox rows passes silently, prepared and
// committed.
func TestXARowsHeldUntilCommit(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	r, c := tailFromNow(t, db)

	rolledBack := xaPrepare(t, db.SQL, "rolled-back", newRecords(3))
	foreign := xaPrepare(t, db.SQL, "foreign", nil)
	committed := xaPrepare(t, db.SQL, "committed", newRecords(2))
	waitCovered(t, r, c, currentPosition(t, db.SQL), 30*time.Second)
	xaDecide(t, rolledBack, "ROLLBACK", "rolled-back")
	xaDecide(t, foreign, "COMMIT", "foreign")
	if err := insertRecords(testCtx(t), db.SQL, newRecords(1)); err != nil {
		t.Fatal(err)
	}
	waitCovered(t, r, c, currentPosition(t, db.SQL), 30*time.Second)
	if got, _ := c.snapshot(); len(got) != 1 {
		t.Fatalf("handler got %d rows, want only the 1 committed outside XA", len(got))
	}

	xaDecide(t, committed, "COMMIT", "committed")
	err := waitExit(t, r)
	var xe *XACommitError
	if !errors.As(err, &xe) || !xe.Seen || xe.Rows != 2 || xe.XID != "x'636f6d6d6974746564',x'',1" {
		t.Fatalf("Run returned %v, want an *XACommitError for the 2 rows of xid 'committed'", err)
	}
	t.Log(err)
	if got, _ := c.snapshot(); len(got) != 1 {
		t.Fatalf("handler got %d rows, want 1", len(got))
	}
}

// TestXAPrepareOlderThanTheStream: the XA COMMIT of a transaction
// prepared before the stream's start, with outbox rows, stops Run with an
// *XACommitError (whether the tailer learned the prepare: MariaDB often
// sends the prepare groups still undecided at a dump's start, which the
// tailer records while skipping them, or not); its XA ROLLBACK costs
// nothing.
func TestXAPrepareOlderThanTheStream(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	// Closed connections: the prepared transactions outlive them (as
	// after a crash of the transaction manager's process), and any
	// session may decide them.
	disconnect(xaPrepare(t, db.SQL, "before-a", newRecords(1)))
	disconnect(xaPrepare(t, db.SQL, "before-b", newRecords(1)))
	for _, q := range []string{"FLUSH BINARY LOGS", "INSERT INTO other (v) VALUES ('after the flush')"} {
		if _, err := db.SQL.ExecContext(testCtx(t), q); err != nil {
			t.Fatal(err)
		}
	}
	r, c := tailFromNow(t, db)
	xaDecide(t, db.SQL, "ROLLBACK", "before-a")
	waitCovered(t, r, c, currentPosition(t, db.SQL), 30*time.Second)
	xaDecide(t, db.SQL, "COMMIT", "before-b")
	err := waitExit(t, r)
	var xe *XACommitError
	if !errors.As(err, &xe) || xe.Seen && xe.Rows != 1 {
		t.Fatalf("Run returned %v, want an *XACommitError for before-b", err)
	}
	t.Log(err)
}

// An XA COMMIT whose prepare the Run never read (MySQL does not send it
// again) might have written outbox rows: Run says so.
func TestUnitXACommitUnseen(t *testing.T) {
	tl, err := New(Config{Host: "h", User: "u", ServerID: 9, Schema: "app", Table: "outbox"})
	if err != nil {
		t.Fatal(err)
	}
	s := &session{t: tl, h: &collector{}, xaBook: newXABook(), open: true, txnID: "g"}
	ev := &replication.BinlogEvent{Header: &replication.EventHeader{}}
	err = s.xaQuery(context.Background(), ev, "COMMIT", "x'01',x'',1", false)
	var xe *XACommitError
	if !errors.As(err, &xe) || xe.Seen {
		t.Fatalf("XA COMMIT of an unseen prepare: %v, want an *XACommitError with Seen false", err)
	}
	s.xaBook.prepare("x'02',x'',1", 0)
	s.open = true
	if err := s.xaQuery(context.Background(), ev, "COMMIT", "x'02',x'',1", false); err != nil {
		t.Fatalf("XA COMMIT of a prepare without outbox rows: %v, want nil", err)
	}
}

// TestXAOnePhaseHeld: XA COMMIT … ONE PHASE. MariaDB logs it as an
// ordinary transaction, whose rows are delivered.
func TestXAOnePhase(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	r, c := tailFromNow(t, db)
	ctx := testCtx(t)
	w := writer(t, db.SQL)
	for _, q := range []string{"XA START 'one'", "", "XA END 'one'", "XA COMMIT 'one' ONE PHASE"} {
		var err error
		if q == "" {
			err = insertRecords(ctx, w, newRecords(2))
		} else {
			_, err = w.ExecContext(ctx, q)
		}
		if err != nil {
			t.Fatalf("%q: %v", q, err)
		}
	}
	waitCovered(t, r, c, currentPosition(t, db.SQL), 30*time.Second)
	if got, _ := c.snapshot(); len(got) != 2 {
		t.Fatalf("handler got %d rows, want 2", len(got))
	}
}

// TestStatementLoggedWriteStopsRun: an INSERT, a REPLACE or a LOAD DATA
// into the outbox logged as a statement stops Run with a *StatementError
// naming the transaction; statements on other tables, and a DELETE of the
// outbox, do not.
func TestStatementLoggedWriteStopsRun(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	file := filepath.Join(t.TempDir(), "rows.tsv")
	if err := os.WriteFile(file, []byte(fmt.Sprintf("%016d\tk\tp\n", time.Now().UnixNano()%1e16)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, stmt string }{
		{"insert", "INSERT INTO outbox (message_id, routing_key, payload) VALUES (UNHEX(REPLACE(UUID(),'-','')), 'k', 'p')"},
		{"replace qualified", "REPLACE INTO `%s`.`outbox` (message_id, routing_key, payload) VALUES (UNHEX(REPLACE(UUID(),'-','')), 'k', 'p')"},
		{"load data", "LOAD DATA INFILE '" + file + "' INTO TABLE outbox (message_id, routing_key, payload)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			tl, err := New(tailerConfig(t, db))
			if err != nil {
				t.Fatal(err)
			}
			c := &collector{}
			from := currentPosition(t, db.SQL)
			r := startRun(t, tl, from, c)
			w := writer(t, db.SQL)
			for _, q := range []string{
				"SET SESSION binlog_format = 'STATEMENT'",
				"INSERT INTO other (v) VALUES ('statement')",
				"DELETE FROM outbox WHERE id = 0",
			} {
				if _, err := w.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			waitCovered(t, r, c, currentPosition(t, db.SQL), 30*time.Second)
			stmt := tc.stmt
			if tc.name == "replace qualified" {
				stmt = fmt.Sprintf(stmt, db.Name)
			}
			if _, err := w.ExecContext(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
			err = waitExit(t, r)
			var se *StatementError
			if !errors.As(err, &se) || se.GTID == "" {
				t.Fatalf("Run returned %v, want a *StatementError naming the transaction", err)
			}
			t.Log(err)
		})
	}
}
