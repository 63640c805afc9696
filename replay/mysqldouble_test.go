package replay

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/mysqldouble"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// TestReplayMySQLDouble: a replay from a MySQL 8.4 server (the MySQL test
// double, whose bytes canal's tests check against real MySQL binlogs) takes
// a UUID GTID set as --from-gtid and a set with a tag as --to-gtid, reads
// plain, zstd-compressed and tagged transactions, and publishes every row
// of the range once, in order per key, to the real broker; its summary
// names the first and last GTIDs (uuid:n, uuid:tag:n).
func TestReplayMySQLDouble(t *testing.T) {
	sid := uuid.MustParse("1b4bd5d4-9f3c-11ef-9a3e-0242ac120002")
	srv, err := mysqldouble.Start(mysqldouble.Config{Version: mysqldouble.MySQL84, User: "relay", Password: "secret", ServerUUID: sid, ServerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	b := testenv.RabbitMQ(t)
	table := mysqldouble.Table{ID: 60, Schema: "app", Name: "outbox", Columns: mysqldouble.OutboxColumns()}
	var want []written
	rows := func(first, n int) [][]any {
		var out [][]any
		for id := first; id < first+n; id++ {
			key := fmt.Sprintf("k%d", id%2)
			mid := fmt.Sprintf("%016d", id)
			out = append(out, []any{uint64(id), mid, key, "", "rk", "t", map[string]string{"n": fmt.Sprint(id)}, []byte("{}"),
				"application/json", time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), nil, nil, uint32(0), nil})
			var m outbox.MessageID
			copy(m[:], mid)
			want = append(want, written{id: m, key: key, routingKey: "rk", msgType: "t"})
		}
		return out
	}
	commitTxn := func(txn mysqldouble.Txn) {
		txn.Table = table
		if _, err := srv.Commit(txn); err != nil {
			t.Fatal(err)
		}
	}
	commitTxn(mysqldouble.Txn{Rows: rows(1, 2)})
	want = want[:0] // before the range
	commitTxn(mysqldouble.Txn{Rows: rows(3, 3), Compressed: true})
	commitTxn(mysqldouble.Txn{Rows: rows(6, 1), Tag: "billing"})
	commitTxn(mysqldouble.Txn{Rows: rows(7, 2), Compressed: true, Tag: "billing"})
	n := len(want)
	commitTxn(mysqldouble.Txn{Rows: rows(9, 1)}) // after the range
	want = want[:n]

	cfg := Config{
		MySQLDSN: fmt.Sprintf("relay:secret@tcp(%s)/app", srv.Addr()), AMQPURL: b.URL, DefaultExchange: b.Exchange,
		ServerID: 88, Logger: zaptest.NewLogger(t).Named("replay"),
		Range: Range{FromGTID: sid.String() + ":1", ToGTID: sid.String() + ":1-2:billing:1-2"},
	}
	s, err := Run(testenv.WorkContext(t), cfg)
	if err != nil {
		t.Fatalf("replay: %v (summary %+v)", err, s)
	}
	if s.Messages != len(want) || s.Confirmed != len(want) || s.Transactions != 3 ||
		s.FirstGTID != sid.String()+":2" || s.LastGTID != sid.String()+":billing:2" {
		t.Fatalf("summary %+v; want %d messages in 3 transactions from %s:2 to %s:billing:2", s, len(want), sid, sid)
	}
	checkReplayed(t, drain(t, b.URL, b.Queue), want, 0)
}
