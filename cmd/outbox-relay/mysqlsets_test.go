package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/internal/mysqldouble"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// MySQL GTID sets in the operator commands: a checkpoint stored as a UUID
// set with a tag (MySQL 8.3+) is shown verbatim by status and checkpoint
// show; checkpoint set checks a set against the server it is connected to
// (a UUID set on MariaDB is refused, naming the flavor); replay on a MySQL
// 8.4 server (the MySQL test double) takes a UUID --from-gtid and a tagged
// --to-gtid and reports uuid:n and uuid:tag:n GTIDs.
func TestCLIMySQLGTIDSets(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	migrate(t, db.DSN)
	const set = "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100:relay:1-7,8a94f357-aab4-11df-86ab-c80aa9429562:1-5:7-9"
	opsExec(t, db, "INSERT INTO outbox_relay_progress (relay_name, outbox_table, flavor, gtid_set, epoch) VALUES ('default', 'outbox', 'mysql', ?, 3)", set)
	s := statusOf(t, db)
	if s.Checkpoint.Flavor == nil || *s.Checkpoint.Flavor != "mysql" || s.Checkpoint.GTIDSet == nil || *s.Checkpoint.GTIDSet != set {
		t.Fatalf("status: checkpoint %+v, want mysql %s", s.Checkpoint, set)
	}
	if r := ops(t, db, "status"); r.code != 0 || !strings.Contains(r.stdout, set) {
		t.Fatalf("status table does not show %s: %+v", set, r)
	}
	r := ops(t, db, "checkpoint", "show", "--json")
	var show checkpointShowJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &show) != nil || show.Checkpoint.GTIDSet == nil || *show.Checkpoint.GTIDSet != set {
		t.Fatalf("checkpoint show: %+v", r)
	}
	r = ops(t, db, "checkpoint", "set", "--gtid", set)
	if r.code != 2 || !strings.Contains(r.stderr, "mariadb") {
		t.Fatalf("checkpoint set of a MySQL set on MariaDB: %+v", r)
	}

	sid := uuid.MustParse("1b4bd5d4-9f3c-11ef-9a3e-0242ac120002")
	srv, err := mysqldouble.Start(mysqldouble.Config{Version: mysqldouble.MySQL84, User: "relay", Password: "secret", ServerUUID: sid, ServerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	table := mysqldouble.Table{ID: 60, Schema: "app", Name: "outbox", Columns: mysqldouble.OutboxColumns()}
	for i, txn := range []mysqldouble.Txn{{}, {Compressed: true}, {Tag: "billing"}, {Compressed: true, Tag: "billing"}, {}} {
		txn.Table = table
		txn.Rows = [][]any{{uint64(i + 1), fmt.Sprintf("%016d", i+1), "k", "", "rk", "t", nil, []byte("{}"),
			"application/json", time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), nil, nil, uint32(0), nil}}
		if _, err := srv.Commit(txn); err != nil {
			t.Fatal(err)
		}
	}
	b := testenv.RabbitMQ(t)
	r = runBinary(t, relayBinary(t), nil, "replay", "--mysql-dsn", fmt.Sprintf("relay:secret@tcp(%s)/app", srv.Addr()),
		"--amqp-url", b.URL, "--default-exchange", b.Exchange, "--dry-run", "--json",
		"--from-gtid", sid.String()+":1", "--to-gtid", sid.String()+":1-2:billing:1-2")
	var sum struct {
		Messages  int    `json:"messages"`
		FirstGTID string `json:"first_gtid"`
		LastGTID  string `json:"last_gtid"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sum) != nil || sum.Messages != 3 ||
		sum.FirstGTID != sid.String()+":2" || sum.LastGTID != sid.String()+":billing:2" {
		t.Fatalf("replay --dry-run on MySQL 8.4: %+v (summary %+v)", r, sum)
	}
}
