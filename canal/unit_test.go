package canal

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

func TestConfigValidateDefaults(t *testing.T) {
	c := Config{Host: "h", User: "u", ServerID: 7, Schema: "s", Table: "outbox"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Port != 3306 || c.HeartbeatPeriod != 5*time.Second || c.ReadTimeout != 15*time.Second ||
		c.EventCacheCount != 64 || c.RetryMin != 200*time.Millisecond || c.RetryMax != 5*time.Second || c.Logger == nil {
		t.Fatalf("defaults not applied: %+v", c)
	}
	bad := Config{Host: "h", User: "u", Schema: "s", Table: "t", HeartbeatPeriod: time.Second, ReadTimeout: time.Second, Flavor: "pg"}
	err := bad.Validate()
	for _, want := range []string{"ServerID is 0", "must be less than ReadTimeout", `Flavor "pg"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
}

func TestPosition(t *testing.T) {
	for _, tc := range []struct {
		p    position.Position
		zero bool
		gtid bool
		str  string
	}{
		{position.Position{Flavor: "mariadb"}, true, true, "mariadb (start of binlogs)"},
		{position.Position{Flavor: "mariadb", GTIDSet: "0-1-5,1-1-2"}, false, true, "mariadb gtid 0-1-5,1-1-2"},
		{position.Position{Flavor: "mysql", File: "binlog.000003", Pos: 1234}, false, false, "mysql file binlog.000003:1234"},
		{position.Position{Flavor: "mysql", GTIDSet: "x", File: "binlog.000003", Pos: 4}, false, true, "mysql gtid x"},
	} {
		if tc.p.IsZero() != tc.zero || tc.p.GTIDMode() != tc.gtid || tc.p.String() != tc.str {
			t.Errorf("%#v: IsZero %v gtidMode %v String %q", tc.p, tc.p.IsZero(), tc.p.GTIDMode(), tc.p.String())
		}
	}
}

func TestGlobalPrivileges(t *testing.T) {
	privs := globalPrivileges([]string{
		"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `relay`@`%` IDENTIFIED BY PASSWORD '*ABC'",
		"GRANT SELECT, INSERT ON `app`.* TO `relay`@`%`",
		"GRANT `r1` TO `relay`@`%`",
	})
	if !hasAny(privs, replSlaveEquivalents) || !hasAny(privs, replClientEquivalents) || privs["SELECT"] {
		t.Fatalf("privileges %v", privs)
	}
	privs = globalPrivileges([]string{"GRANT REPLICATION SLAVE ADMIN ON *.* TO `x`@`%`"})
	if hasAny(privs, replSlaveEquivalents) {
		t.Fatal("REPLICATION SLAVE ADMIN taken for REPLICATION SLAVE")
	}
	if !hasAny(globalPrivileges([]string{"GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION"}), replClientEquivalents) {
		t.Fatal("ALL PRIVILEGES not accepted")
	}
	if got := quoteAccount("relay@10.0.%"); got != "'relay'@'10.0.%'" {
		t.Fatal(got)
	}
}

// outboxTableMap is a TABLE_MAP of the docs/tables.md outbox table as MariaDB
// writes it (JSON is LONGTEXT, i.e. BLOB), in a non-default column order.
func outboxTableMap(names ...string) *replication.TableMapEvent {
	if names == nil {
		names = []string{"payload", "id", "message_id", "partition_key", "exchange", "routing_key", "message_type",
			"headers", "content_type", "created_at", "available_at", "delivered_at", "attempts", "last_error"}
	}
	types := map[string]byte{
		"id": mysql.MYSQL_TYPE_LONGLONG, "message_id": mysql.MYSQL_TYPE_STRING, "headers": mysql.MYSQL_TYPE_BLOB,
		"payload": mysql.MYSQL_TYPE_BLOB, "created_at": mysql.MYSQL_TYPE_DATETIME2, "available_at": mysql.MYSQL_TYPE_DATETIME2,
		"delivered_at": mysql.MYSQL_TYPE_DATETIME2, "attempts": mysql.MYSQL_TYPE_LONG,
	}
	tme := &replication.TableMapEvent{Schema: []byte("app"), Table: []byte("outbox"), ColumnCount: uint64(len(names))}
	for _, n := range names {
		tp, ok := types[n]
		if !ok {
			tp = mysql.MYSQL_TYPE_VARCHAR
		}
		tme.ColumnType = append(tme.ColumnType, tp)
		tme.ColumnMeta = append(tme.ColumnMeta, 0)
		tme.ColumnName = append(tme.ColumnName, []byte(n))
	}
	return tme
}

// outboxRow builds a row image for outboxTableMap() in its column order.
func outboxRow(id uint64, mid string, payload []byte, headers any, avail any) []any {
	created := time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)
	return []any{payload, id, mid, "pk-ü", "ex", "rk", "type", headers, "application/json", created, avail, nil, uint32(0), nil}
}

func TestRecordDecode(t *testing.T) {
	m, err := mapColumns(outboxTableMap())
	if err != nil {
		t.Fatal(err)
	}
	// message_id ending in zero bytes arrives stripped; payload keeps its 0x00.
	mid := "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c"
	payload := []byte{0, 1, 0, 2, 0}
	rec, err := m.record(outboxRow(1<<63+5, mid, payload, []byte(`{"a":1}`), "2024-05-06 07:08:10.000001"), nil)
	if err != nil {
		t.Fatal(err)
	}
	wantID := outbox.MessageID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 0, 0, 0}
	if rec.ID != 1<<63+5 || rec.MessageID != wantID || rec.PartitionKey != "pk-ü" || rec.Exchange != "ex" ||
		rec.RoutingKey != "rk" || rec.MessageType != "type" || string(rec.Headers) != `{"a":1}` ||
		!bytes.Equal(rec.Payload, payload) || rec.ContentType != "application/json" {
		t.Fatalf("record %+v", rec)
	}
	if !rec.CreatedAt.Equal(time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)) || rec.CreatedAt.Location() != time.UTC {
		t.Fatalf("created_at %v", rec.CreatedAt)
	}
	if !rec.AvailableAt.Equal(time.Date(2024, 5, 6, 7, 8, 10, 1000, time.UTC)) {
		t.Fatalf("available_at %v", rec.AvailableAt)
	}
	// The record must not alias go-mysql's buffers.
	payload[0] = 9
	if rec.Payload[0] != 0 {
		t.Fatal("payload aliases the event buffer")
	}

	// NULL headers and available_at; signed id (no signedness metadata); MySQL JSON as string.
	row := outboxRow(0, strings.Repeat("\xff", 16), []byte{}, nil, nil)
	row[1] = int64(-1)
	rec, err = m.record(row, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rec.ID != 1<<64-1 || rec.Headers != nil || !rec.AvailableAt.IsZero() || rec.Payload == nil {
		t.Fatalf("record %+v", rec)
	}
	row[7] = `{"b":true}`
	if rec, err = m.record(row, nil); err != nil || string(rec.Headers) != `{"b":true}` {
		t.Fatalf("string JSON: %v %q", err, rec.Headers)
	}

	// A value of the wrong type is a schema problem, hence fatal.
	bad := outboxRow(1, "x", []byte{}, nil, nil)
	bad[1] = "not a number"
	var se *SchemaError
	if _, err := m.record(bad, nil); !errors.As(err, &se) || se.Column != "id" {
		t.Fatalf("bad id: %v", err)
	}

	// A row image without all columns.
	var pe *PreflightError
	if _, err := m.record(row, []int{5}); !errors.As(err, &pe) || pe.Check != CheckRowImage {
		t.Fatalf("skipped column: %v", err)
	}
}

func TestMapColumnsErrors(t *testing.T) {
	names := []string{"id", "message_id", "partition_key", "exchange", "rk", "message_type",
		"headers", "payload", "content_type", "created_at", "available_at"}
	_, err := mapColumns(outboxTableMap(names...))
	var se *SchemaError
	if !errors.As(err, &se) || se.Column != "routing_key" || !strings.Contains(err.Error(), `"routing_key" missing`) {
		t.Fatalf("renamed column: %v", err)
	}
	tme := outboxTableMap()
	tme.ColumnName = nil
	var pe *PreflightError
	if _, err := mapColumns(tme); !errors.As(err, &pe) || pe.Check != CheckRowMetadata {
		t.Fatalf("no names: %v", err)
	}
	tme = outboxTableMap()
	tme.ColumnType[2] = mysql.MYSQL_TYPE_VARCHAR // message_id as VARCHAR
	if _, err := mapColumns(tme); !errors.As(err, &se) || se.Column != "message_id" {
		t.Fatalf("wrong type: %v", err)
	}
}

// recorder is a Handler that records what it is given.
type recorder struct {
	rows    []uint64
	commits []position.Position
	counts  []int
	rowErr  error
}

func (r *recorder) Row(_ context.Context, rec *outbox.Record) error {
	if r.rowErr != nil {
		return r.rowErr
	}
	r.rows = append(r.rows, rec.ID)
	return nil
}

func (r *recorder) Commit(_ context.Context, pos position.Position, rows int) error {
	r.commits = append(r.commits, pos)
	r.counts = append(r.counts, rows)
	return nil
}

func newTestSession(t *testing.T, h Handler, from position.Position) *session {
	t.Helper()
	tl, err := New(Config{Host: "h", User: "u", ServerID: 7, Schema: "app", Table: "outbox"})
	if err != nil {
		t.Fatal(err)
	}
	s := &session{t: tl, h: h, committed: from, gtidMode: from.GTIDMode()}
	if err := s.init(from.Flavor); err != nil {
		t.Fatal(err)
	}
	return s
}

func ev(tp replication.EventType, logPos uint32, e replication.Event) *replication.BinlogEvent {
	return &replication.BinlogEvent{Header: &replication.EventHeader{EventType: tp, LogPos: logPos}, Event: e}
}

func mariaGTID(domain uint32, seq uint64, standalone bool) *replication.BinlogEvent {
	var flags byte
	if standalone {
		flags = replication.BINLOG_MARIADB_FL_STANDALONE
	}
	return ev(replication.MARIADB_GTID_EVENT, 0, &replication.MariadbGTIDEvent{
		GTID: mysql.MariadbGTID{DomainID: domain, ServerID: 1, SequenceNumber: seq}, Flags: flags})
}

func writeRows(tme *replication.TableMapEvent, ids ...uint64) *replication.BinlogEvent {
	re := &replication.RowsEvent{Table: tme}
	for _, id := range ids {
		re.Rows = append(re.Rows, outboxRow(id, "0123456789abcdef", []byte("p"), nil, nil))
	}
	return ev(replication.WRITE_ROWS_EVENTv1, 0, re)
}

func feed(t *testing.T, s *session, evs ...*replication.BinlogEvent) error {
	t.Helper()
	for _, e := range evs {
		if err := s.event(context.Background(), e); err != nil {
			return err
		}
	}
	return nil
}

func TestSessionTransactions(t *testing.T) {
	h := &recorder{}
	s := newTestSession(t, h, position.Position{Flavor: FlavorMariaDB, GTIDSet: "0-1-4,1-1-9"})
	tme := outboxTableMap()
	foreign := outboxTableMap()
	foreign.Table = []byte("other")
	update := writeRows(tme, 99)
	update.Header.EventType = replication.UPDATE_ROWS_EVENTv1

	err := feed(t, s,
		ev(replication.ROTATE_EVENT, 0, &replication.RotateEvent{Position: 4, NextLogName: []byte("bin.000001")}),
		mariaGTID(0, 5, false), writeRows(tme, 1, 2), writeRows(foreign, 50), writeRows(tme, 3), update,
		ev(replication.XID_EVENT, 100, &replication.XIDEvent{}),
		mariaGTID(1, 10, true), ev(replication.QUERY_EVENT, 200, &replication.QueryEvent{Query: []byte("ALTER TABLE other ADD c INT")}),
		mariaGTID(0, 5, false), writeRows(tme, 1, 2, 3), ev(replication.XID_EVENT, 300, &replication.XIDEvent{}), // duplicate: guard
		mariaGTID(0, 6, false), ev(replication.QUERY_EVENT, 0, &replication.QueryEvent{Query: []byte("BEGIN")}),
		writeRows(tme, 4), ev(replication.QUERY_EVENT, 400, &replication.QueryEvent{Query: []byte("COMMIT")}),
	)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.rows; len(got) != 4 || got[0] != 1 || got[3] != 4 {
		t.Fatalf("rows %v", got)
	}
	want := []position.Position{
		{Flavor: "mariadb", GTIDSet: "0-1-5,1-1-9", File: "bin.000001", Pos: 100},
		{Flavor: "mariadb", GTIDSet: "0-1-5,1-1-10", File: "bin.000001", Pos: 200},
		{Flavor: "mariadb", GTIDSet: "0-1-6,1-1-10", File: "bin.000001", Pos: 400},
	}
	if len(h.commits) != len(want) {
		t.Fatalf("commits %v", h.commits)
	}
	for i := range want {
		if h.commits[i] != want[i] {
			t.Errorf("commit %d = %+v, want %+v", i, h.commits[i], want[i])
		}
	}
	if h.counts[0] != 3 || h.counts[1] != 0 || h.counts[2] != 1 {
		t.Fatalf("counts %v", h.counts)
	}
}

func TestSessionResumeSkipsDeliveredRows(t *testing.T) {
	h := &recorder{}
	s := newTestSession(t, h, position.Position{Flavor: FlavorMariaDB, GTIDSet: "0-1-4"})
	tme := outboxTableMap()
	if err := feed(t, s, mariaGTID(0, 5, false), writeRows(tme, 1, 2), writeRows(tme, 3)); err != nil {
		t.Fatal(err)
	}
	// Connection lost; the second connection dies while re-reading too.
	s.interrupted()
	s.beginConnection()
	if err := feed(t, s, mariaGTID(0, 5, false), writeRows(tme, 1, 2)); err != nil {
		t.Fatal(err)
	}
	s.interrupted()
	s.beginConnection()
	if s.resumeRows != 3 {
		t.Fatalf("resumeRows %d after a partial re-read", s.resumeRows)
	}
	if err := feed(t, s, mariaGTID(0, 5, false), writeRows(tme, 1, 2), writeRows(tme, 3, 4),
		ev(replication.XID_EVENT, 10, &replication.XIDEvent{})); err != nil {
		t.Fatal(err)
	}
	if len(h.rows) != 4 || h.rows[3] != 4 || len(h.commits) != 1 || h.counts[0] != 4 {
		t.Fatalf("rows %v commits %v counts %v", h.rows, h.commits, h.counts)
	}

	// A different transaction after the reconnect is a divergence.
	if err := feed(t, s, mariaGTID(0, 6, false), writeRows(tme, 5)); err != nil {
		t.Fatal(err)
	}
	s.interrupted()
	s.beginConnection()
	var de *DivergedError
	if err := feed(t, s, mariaGTID(0, 7, false)); !errors.As(err, &de) || de.Rows != 1 {
		t.Fatalf("diverged: %v", err)
	}
}

func TestSessionMySQLShapes(t *testing.T) {
	h := &recorder{}
	sid := []byte{0x3e, 0x11, 0xfa, 0x47, 0x71, 0xca, 0x11, 0xe1, 0x9e, 0x33, 0xc8, 0x0a, 0xa9, 0x42, 0x95, 0x62}
	s := newTestSession(t, h, position.Position{Flavor: FlavorMySQL, GTIDSet: "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5"})
	tme := outboxTableMap()
	err := feed(t, s,
		ev(replication.GTID_EVENT, 0, &replication.GTIDEvent{SID: sid, GNO: 6}),
		ev(replication.QUERY_EVENT, 0, &replication.QueryEvent{Query: []byte("BEGIN")}),
		writeRows(tme, 1), ev(replication.XID_EVENT, 100, &replication.XIDEvent{}),
		ev(replication.GTID_EVENT, 0, &replication.GTIDEvent{SID: sid, GNO: 7}),
		ev(replication.QUERY_EVENT, 200, &replication.QueryEvent{Query: []byte("CREATE TABLE x (a INT)")}),
		ev(replication.GTID_EVENT, 0, &replication.GTIDEvent{SID: sid, GNO: 3}), // already executed
		ev(replication.QUERY_EVENT, 0, &replication.QueryEvent{Query: []byte("BEGIN")}),
		writeRows(tme, 1), ev(replication.XID_EVENT, 300, &replication.XIDEvent{}),
	)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.rows) != 1 || len(h.commits) != 2 ||
		h.commits[0].GTIDSet != "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-6" ||
		h.commits[1].GTIDSet != "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-7" {
		t.Fatalf("rows %v commits %+v", h.rows, h.commits)
	}
}

func TestFatalClassification(t *testing.T) {
	tl, err := New(Config{Host: "h", User: "u", ServerID: 7, Schema: "app", Table: "outbox"})
	if err != nil {
		t.Fatal(err)
	}
	s := &session{committed: position.Position{Flavor: "mariadb", GTIDSet: "0-1-5"}}
	ctx := context.Background()
	var pu *PurgedError
	if err := tl.fatal(ctx, &mysql.MyError{Code: 1236, Message: "Could not find GTID state requested by slave in any binlog files"}, s); !errors.As(err, &pu) || pu.Position.GTIDSet != "0-1-5" {
		t.Fatalf("1236: %v", err)
	}
	var ae *AccessError
	if err := tl.fatal(ctx, &mysql.MyError{Code: 1227, Message: "Access denied"}, s); !errors.As(err, &ae) {
		t.Fatalf("1227: %v", err)
	}
	if err := tl.fatal(ctx, errors.New("read tcp: connection reset by peer"), s); err != nil {
		t.Fatalf("transient classified fatal: %v", err)
	}
	if err := tl.fatal(ctx, &mysql.MyError{Code: 1053, Message: "Server shutdown in progress"}, s); err != nil {
		t.Fatalf("shutdown classified fatal: %v", err)
	}
	// TLS failures are named as such, never as missing grants.
	for _, c := range []struct {
		err  error
		want string
	}{
		{&mysql.MyError{Code: 3159, Message: "Connections using insecure transport are prohibited while --require_secure_transport=ON."},
			"requires TLS (require_secure_transport=ON)"},
		{fmt.Errorf("writeAuthHandshake: %w", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}),
			"not signed by a CA this system trusts"},
		{errors.New("readInitialHandshake: the MySQL Server does not support TLS required by the client"), "does not offer TLS"},
	} {
		err := tl.fatal(ctx, c.err, s)
		var te *TLSError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), c.want) || errors.As(err, &ae) {
			t.Errorf("fatal(%v) = %v; want a *TLSError saying %q", c.err, err, c.want)
		}
	}
}
