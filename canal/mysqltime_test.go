package canal

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/mysqldouble"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/position"
)

// TimePosition (replay --from-time) on MySQL 8.0 and 8.4 streams: over three
// binlog files of different start times it finds the first transaction at or
// after the time, its file and offset, and the position just before it: with
// GTIDs the file's Previous_gtids plus the transactions read before it (a
// tagged one among them), without GTIDs (gtid_mode OFF) the file and offset.
// A time past the last transaction is not found and gives the end.
func TestMySQLDoubleTimePosition(t *testing.T) {
	base := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		v       mysqldouble.Version
		gtidOff bool
	}{{"8.0", mysqldouble.MySQL80, false}, {"8.4", mysqldouble.MySQL84, false}, {"8.4 gtid_mode OFF", mysqldouble.MySQL84, true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv, err := mysqldouble.Start(mysqldouble.Config{Version: c.v, User: "relay", Password: "secret",
				ServerUUID: doubleUUID, ServerID: 1, GTIDModeOff: c.gtidOff})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			// binlog.000001 from base: transactions at +0 s and +10 s (tagged);
			// binlog.000002 from +20 s: +20 s; binlog.000003 from +40 s:
			// +40 s and +50 s.
			at := func(sec int, txn mysqldouble.Txn) {
				srv.SetTime(base.Add(time.Duration(sec) * time.Second))
				commit(t, srv, txn)
			}
			srv.SetTime(base)
			srv.Rotate() // binlog.000002 then starts at base; the first file is the double's own
			at(0, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(1, 1)})
			at(10, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(2, 1), Tag: "outbox"})
			srv.SetTime(base.Add(20 * time.Second))
			srv.Rotate()
			at(20, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(3, 1)})
			srv.SetTime(base.Add(40 * time.Second))
			srv.Rotate()
			at(40, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(4, 1)})
			at(50, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(5, 1), Compressed: true})

			ctx := testenv.WorkContext(t)
			db := doubleDB(t, srv)
			tl, err := New(doubleConfig(t, srv))
			if err != nil {
				t.Fatal(err)
			}
			u := doubleUUID.String()
			for _, q := range []struct {
				sec     int
				found   bool
				file    string
				txnTime int
				gtidSet string // before the transaction; "" without GTIDs
			}{
				{sec: 5, found: true, file: "binlog.000002", txnTime: 10, gtidSet: u + ":1"},
				{sec: 15, found: true, file: "binlog.000003", txnTime: 20, gtidSet: u + ":1:outbox:1"},
				{sec: 45, found: true, file: "binlog.000004", txnTime: 50, gtidSet: u + ":1-3:outbox:1"},
				{sec: 60, found: false, file: "binlog.000004", gtidSet: u + ":1-4:outbox:1"},
			} {
				tp, err := tl.TimePosition(ctx, db, base.Add(time.Duration(q.sec)*time.Second))
				if err != nil {
					t.Fatalf("+%d s: %v", q.sec, err)
				}
				if tp.Found != q.found || tp.File != q.file || q.found && !tp.Time.Equal(base.Add(time.Duration(q.txnTime)*time.Second)) {
					t.Fatalf("+%d s: %+v; want found %v in %s at +%d s", q.sec, tp, q.found, q.file, q.txnTime)
				}
				want := position.Position{Flavor: position.FlavorMySQL, GTIDSet: q.gtidSet}
				if c.gtidOff {
					want = position.Position{Flavor: position.FlavorMySQL, File: tp.File, Pos: tp.Pos}
				}
				if tp.Position != want {
					t.Fatalf("+%d s: position %+v, want %+v", q.sec, tp.Position, want)
				}
			}
		})
	}
}

// SnapshotPosition on MySQL: with BACKUP_ADMIN it reads
// performance_schema.log_status, without it (the grants docs/operations.md
// and deploy/mysql-init.sql give the relay) the server refuses that read
// and it falls back to the current position; with GTIDs or without, both
// give the position of what was committed.
func TestMySQLDoubleSnapshotPosition(t *testing.T) {
	for _, c := range []struct {
		name    string
		grants  []string
		gtidOff bool
	}{
		{"BACKUP_ADMIN", []string{"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `relay`@`%`", "GRANT BACKUP_ADMIN ON *.* TO `relay`@`%`"}, false},
		{"BACKUP_ADMIN gtid_mode OFF", []string{"GRANT ALL PRIVILEGES ON *.* TO `relay`@`%`"}, true},
		{"replication grants only", nil, false},
		{"replication grants only gtid_mode OFF", nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv, err := mysqldouble.Start(mysqldouble.Config{Version: mysqldouble.MySQL84, User: "relay", Password: "secret",
				ServerUUID: doubleUUID, ServerID: 1, GTIDModeOff: c.gtidOff, Grants: c.grants})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			commit(t, srv, mysqldouble.Txn{Table: outboxTable, Rows: outboxRows(1, 2)})
			db := doubleDB(t, srv)
			ctx := testenv.WorkContext(t)
			var logStatus string
			err = db.QueryRowContext(ctx, "SELECT LOCAL FROM performance_schema.log_status").Scan(&logStatus)
			if granted := c.grants != nil; (err == nil) != granted {
				t.Fatalf("log_status with grants %q: %v", c.grants, err)
			}
			cur, err := CurrentPosition(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			snap, err := SnapshotPosition(ctx, db)
			if err != nil || snap != cur || c.gtidOff == (snap.GTIDSet != "") {
				t.Fatalf("snapshot position %+v (%v), want %+v", snap, err, cur)
			}
		})
	}
}
