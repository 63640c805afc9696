package relay

import (
	"context"
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

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/internal/mysqldouble"
	"github.com/outbox-relay/outbox-relay/position"
)

// Binlog mode on a MySQL-shaped server: internal/mysqldouble answers the
// preflight, the position reads and the lossy-failover check as MySQL 8.4
// does and serves its binlog (bytes checked against real MySQL binlogs in
// canal's tests) to the production canalBinlog and canal.Tailer. The
// progress row and the broker are the unit tests' fakes: the double runs
// no SQL.

var mysqlSID = uuid.MustParse("8a94f357-aab4-11df-86ab-c80aa9429562")

// mysqlRun is runBinlog on the double, resuming from the fake store's
// position.
type mysqlRun struct {
	*binlogRun
	srv *mysqldouble.Server
}

func startMySQLDouble(t *testing.T) *mysqldouble.Server {
	t.Helper()
	srv, err := mysqldouble.Start(mysqldouble.Config{Version: mysqldouble.MySQL84, User: "relay", Password: "secret",
		ServerUUID: mysqlSID, ServerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// createdOutbox is the stored position of a relay that has seen the
// outbox table created (CREATE TABLE, the first transaction of srv): a
// GTID set to resume from, so the runs need no first-start sweep.
func createdOutbox(t *testing.T, srv *mysqldouble.Server) *fakeStore {
	t.Helper()
	if _, err := srv.Commit(mysqldouble.Txn{Table: doubleOutbox, Query: "CREATE TABLE outbox (id BIGINT UNSIGNED)"}); err != nil {
		t.Fatal(err)
	}
	store := newFakeStore()
	store.progress.Position = position.Position{Flavor: position.FlavorMySQL, GTIDSet: srv.Executed()}
	return store
}

// runOnDouble starts binlog mode on srv from store's position.
func runOnDouble(t *testing.T, srv *mysqldouble.Server, store *fakeStore) *mysqlRun {
	t.Helper()
	dcfg := driver.NewConfig()
	dcfg.User, dcfg.Passwd, dcfg.Net, dcfg.Addr = "relay", "secret", "tcp", srv.Addr()
	conn, err := driver.NewConnector(dcfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { _ = db.Close() })

	b := &binlogRun{store: store, lease: newFakeLease(8), next: make(chan *modeSwitch, 1), err: make(chan error, 1),
		pub: &fakeBinlogPub{fakeBroker: newFakeBroker(), sent: make(chan struct{}, 1000)}}
	b.r = unitRelay(t, store, func(c *Config) { c.Lanes = 4 })
	b.r.db = db
	b.r.canal = canal.Config{Host: "127.0.0.1", Port: srv.Port(), User: "relay", Password: "secret", ServerID: 77,
		Flavor: canal.FlavorMySQL, Schema: "app", Table: "outbox",
		HeartbeatPeriod: 100 * time.Millisecond, ReadTimeout: time.Second,
		RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))}
	b.r.failover.server = dbServer{db: db, addr: srv.Addr}
	b.r.binlog = canalBinlog{r: b.r}
	b.r.readSettings = func(ctx context.Context) (canal.Settings, error) { return canal.ReadSettings(ctx, db) }
	if err := b.r.binlog.Preflight(context.Background()); err != nil {
		t.Fatalf("preflight on MySQL 8.4: %v", err)
	}
	b.launch(t)
	return &mysqlRun{binlogRun: b, srv: srv}
}

var doubleOutbox = mysqldouble.Table{ID: 70, Schema: "app", Name: "outbox", Columns: mysqldouble.OutboxColumns()}

// doubleRows are outbox rows first..first+n-1, keyed by id%3.
func doubleRows(first uint64, n int) [][]any {
	var rows [][]any
	for id := first; id < first+uint64(n); id++ {
		rows = append(rows, []any{id, fmt.Sprintf("%016d", id), fmt.Sprintf("k%d", id%3), "ex", "rk", "t",
			nil, []byte("p"), "application/json", time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), nil, nil, uint32(0), nil})
	}
	return rows
}

func (m *mysqlRun) commit(t *testing.T, txn mysqldouble.Txn) {
	t.Helper()
	txn.Table = doubleOutbox
	if _, err := m.srv.Commit(txn); err != nil {
		t.Fatal(err)
	}
}

// confirmAll waits until ids first..last were published and confirms them.
func (m *mysqlRun) confirmAll(t *testing.T, first, last uint64) {
	t.Helper()
	m.pub.waitPublished(t, int(last))
	for id := first; id <= last; id++ {
		m.pub.confirm(t, id)
	}
}

// checkPublished: ids first..last each published once, in id order per key.
func (m *mysqlRun) checkPublished(t *testing.T, first, last uint64) {
	t.Helper()
	seen := map[uint64]int{}
	lastOfKey := map[uint64]uint64{}
	m.pub.mu.Lock()
	defer m.pub.mu.Unlock()
	for _, s := range m.pub.sinks {
		for _, id := range s.ids() {
			seen[id]++
			if prev, ok := lastOfKey[id%3]; ok && prev > id {
				t.Errorf("id %d published after %d of the same key", id, prev)
			}
			lastOfKey[id%3] = id
		}
	}
	for id := first; id <= last; id++ {
		if seen[id] != 1 {
			t.Errorf("id %d published %d times", id, seen[id])
		}
	}
	if len(seen) != int(last-first+1) {
		t.Errorf("published %d ids, want %d-%d", len(seen), first, last)
	}
}

// TestMySQLDoubleBinlogMode: binlog mode on MySQL 8.4 delivers every row
// once, in order per key, through plain, compressed (turned on mid-stream)
// and tagged transactions; the checkpoint stored is the UUID GTID set with
// its tag; a restart resumes from it and delivers only what follows.
func TestMySQLDoubleBinlogMode(t *testing.T) {
	srv := startMySQLDouble(t)
	store := createdOutbox(t, srv)
	m := runOnDouble(t, srv, store)
	m.commit(t, mysqldouble.Txn{Rows: doubleRows(1, 3)})
	m.commit(t, mysqldouble.Txn{Rows: doubleRows(4, 4), Compressed: true})
	m.commit(t, mysqldouble.Txn{Rows: doubleRows(8, 2), Compressed: true, Tag: "outbox"})
	m.commit(t, mysqldouble.Txn{Rows: doubleRows(10, 1), Tag: "outbox"})
	m.confirmAll(t, 1, 10)
	want := mysqlSID.String() + ":1-3:outbox:1-2"
	store.until(t, "the checkpoint reaches "+want, func() bool {
		_, _, last := store.acked()
		return last.Pos.GTIDSet == want
	})
	m.stop()
	if next, err := m.result(t); next != nil || err != nil {
		t.Fatalf("shutdown: %+v %v", next, err)
	}
	m.checkPublished(t, 1, 10)
	_, _, last := store.acked()
	if last.Pos.Flavor != position.FlavorMySQL {
		t.Fatalf("stored %+v", last.Pos)
	}

	// Restart from the stored checkpoint.
	store2 := newFakeStore()
	store2.progress.Position = last.Pos
	m.commit(t, mysqldouble.Txn{Rows: doubleRows(11, 2), Compressed: true})
	m2 := runOnDouble(t, srv, store2)
	m2.pub.waitPublished(t, 2)
	m2.pub.confirm(t, 11)
	m2.pub.confirm(t, 12)
	want = mysqlSID.String() + ":1-4:outbox:1-2"
	store2.until(t, "the checkpoint reaches "+want, func() bool {
		_, _, last := store2.acked()
		return last.Pos.GTIDSet == want
	})
	m2.stop()
	if _, err := m2.result(t); err != nil {
		t.Fatal(err)
	}
	m2.checkPublished(t, 11, 12)
}

// TestMySQLDoubleLossyFailover: after a reconnect to a server whose
// @@gtid_executed lacks a published UUID interval, binlog mode stops with
// a *LostGTIDsError naming that interval.
func TestMySQLDoubleLossyFailover(t *testing.T) {
	srv := startMySQLDouble(t)
	store := createdOutbox(t, srv)
	m := runOnDouble(t, srv, store)
	for i := range 4 {
		m.commit(t, mysqldouble.Txn{Rows: doubleRows(uint64(i)+1, 1), Compressed: i%2 == 1})
	}
	m.confirmAll(t, 1, 4)
	store.until(t, "the checkpoint reaches transaction 5", func() bool {
		_, _, last := store.acked()
		return last.Pos.GTIDSet == mysqlSID.String()+":1-5"
	})
	// The VIP moves to a replica that never got transactions 4 and 5.
	if err := srv.SetExecuted(mysqlSID.String() + ":1-3"); err != nil {
		t.Fatal(err)
	}
	srv.DropConnections()
	_, err := m.result(t)
	var lost *LostGTIDsError
	if !errors.As(err, &lost) || lost.Missing != mysqlSID.String()+":4-5" ||
		!strings.Contains(err.Error(), mysqlSID.String()+":4-5") {
		t.Fatalf("want a LostGTIDsError naming %s:4-5, got %v", mysqlSID, err)
	}
}
