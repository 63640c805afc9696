package canal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/google/uuid"
	"github.com/klauspost/compress/zstd"

	"github.com/outbox-relay/outbox-relay/position"
)

// Binlog files written by real MySQL servers (testdata/mysql-binlogs,
// README.md there), decoded through the tailer's own event handling: the
// parser configured as the tailer configures its syncer's, each event fed to
// a session as Run does.

const mysqlBinlogDir = "testdata/mysql-binlogs"

// fileEvent is one event of a binlog file, read from its header alone.
type fileEvent struct {
	typ  replication.EventType
	body []byte // after the header, without the checksum
}

// Event header layout (MySQL's log_event.h): timestamp 4, type 1,
// server_id 4, event_size 4, log_pos 4, flags 2.
const (
	evHeaderLen  = 19
	evTypeOffset = 4
	evSizeOffset = 9
	evFlagOffset = 17
	// logEventBinlogInUse is LOG_EVENT_BINLOG_IN_USE_F.
	logEventBinlogInUse = 0x1
)

// readMySQLBinlog reads a testdata binlog as a dump would send it: the
// FORMAT_DESCRIPTION's in-use flag cleared. MySQL computes that event's
// checksum without the flag and clears it before sending (a file copied
// while the server had it open keeps it, and go-mysql's parser then fails
// the checksum).
func readMySQLBinlog(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(mysqlBinlogDir, name))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, replication.BinLogFileHeader) || len(data) < 4+evHeaderLen {
		t.Fatalf("%s is not a binlog file", name)
	}
	data[4+evFlagOffset] &^= logEventBinlogInUse
	return data
}

// headerEvents lists a binlog's events from their headers alone, those
// inside each TRANSACTION_PAYLOAD (decompressed with zstd here, not by
// go-mysql) included, in order. Every file here has CRC32 checksums.
func headerEvents(t testing.TB, data []byte) []fileEvent {
	t.Helper()
	var out []fileEvent
	for off := 4; off < len(data); {
		if off+evHeaderLen > len(data) {
			t.Fatalf("truncated event header at %d", off)
		}
		size := int(binary.LittleEndian.Uint32(data[off+evSizeOffset:]))
		if size < evHeaderLen+4 || off+size > len(data) {
			t.Fatalf("event at %d: size %d", off, size)
		}
		ev := fileEvent{typ: replication.EventType(data[off+evTypeOffset]), body: data[off+evHeaderLen : off+size-4]}
		out = append(out, ev)
		if ev.typ == replication.TRANSACTION_PAYLOAD_EVENT {
			out = append(out, payloadEvents(t, ev.body)...)
		}
		off += size
	}
	return out
}

// payloadEvents decompresses a TRANSACTION_PAYLOAD body (type-length-value
// fields up to the end mark 0, then the zstd frame) and lists its events,
// which carry no checksum.
func payloadEvents(t testing.TB, body []byte) []fileEvent {
	t.Helper()
	i := 0
	for i < len(body) && body[i] != 0 {
		if i+1 >= len(body) {
			t.Fatal("truncated payload header")
		}
		i += 2 + int(body[i+1])
	}
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	raw, err := dec.DecodeAll(body[i+1:], nil)
	if err != nil {
		t.Fatalf("decompress payload: %v", err)
	}
	var out []fileEvent
	for off := 0; off < len(raw); {
		size := int(binary.LittleEndian.Uint32(raw[off+evSizeOffset:]))
		out = append(out, fileEvent{typ: replication.EventType(raw[off+evTypeOffset]), body: raw[off+evHeaderLen : off+size]})
		off += size
	}
	return out
}

func isRowsEventType(tp replication.EventType) bool {
	switch tp {
	case replication.WRITE_ROWS_EVENTv1, replication.UPDATE_ROWS_EVENTv1, replication.DELETE_ROWS_EVENTv1,
		replication.WRITE_ROWS_EVENTv2, replication.UPDATE_ROWS_EVENTv2, replication.DELETE_ROWS_EVENTv2,
		replication.PARTIAL_UPDATE_ROWS_EVENT:
		return true
	}
	return false
}

// headerGTIDs are the transactions' GTIDs as the headers tell them:
// "uuid:n" for GTID events (flags 1, sid 16, gno 8), "" for anonymous ones,
// "tagged" for GTID_TAGGED (whose serialized body is left to go-mysql).
func headerGTIDs(evs []fileEvent) []string {
	var out []string
	for _, e := range evs {
		switch e.typ {
		case replication.GTID_EVENT:
			sid, _ := uuid.FromBytes(e.body[1:17])
			out = append(out, fmt.Sprintf("%s:%d", sid, binary.LittleEndian.Uint64(e.body[17:25])))
		case replication.ANONYMOUS_GTID_EVENT:
			out = append(out, "")
		case replication.GTID_TAGGED_LOG_EVENT:
			out = append(out, "tagged")
		}
	}
	return out
}

// fileParser is a BinlogParser set up as go-mysql's BinlogSyncer sets up
// its own from the tailer's syncer configuration.
func fileParser(tl *Tailer) *replication.BinlogParser {
	conf := tl.syncerConfig(FlavorMySQL)
	p := replication.NewBinlogParser()
	p.SetFlavor(conf.Flavor)
	p.SetParseTime(conf.ParseTime)
	p.SetVerifyChecksum(conf.VerifyChecksum)
	p.SetRowsEventDecodeFunc(conf.RowsEventDecodeFunc)
	return p
}

// decodeMySQLFile feeds the file's events, after a ROTATE naming it (as a
// dump starts), to a session of a tailer for schema.table starting at from.
// It returns the session and the first error.
func decodeMySQLFile(t testing.TB, name string, data []byte, schema, table string, from position.Position, h Handler) (*session, error) {
	t.Helper()
	tl, err := New(Config{Host: "h", User: "u", ServerID: 7, Schema: schema, Table: table, Flavor: FlavorMySQL})
	if err != nil {
		t.Fatal(err)
	}
	s := &session{t: tl, h: h, committed: from, gtidMode: from.GTIDMode(), xaBook: newXABook()}
	if err := s.init(FlavorMySQL); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rotate := &replication.BinlogEvent{Header: &replication.EventHeader{EventType: replication.ROTATE_EVENT},
		Event: &replication.RotateEvent{Position: 4, NextLogName: []byte(name)}}
	if err := s.event(ctx, rotate); err != nil {
		return s, err
	}
	err = fileParser(tl).ParseReader(bytes.NewReader(data[4:]), func(ev *replication.BinlogEvent) error {
		return s.event(ctx, ev)
	})
	return s, err
}

// mysqlFile is what one testdata file must decode to.
type mysqlFile struct {
	name    string
	from    string   // the GTID set the session starts at (the file's PREVIOUS_GTIDS)
	gtids   []string // each transaction's GTID in order ("" anonymous)
	lastPos uint32   // the end of the last transaction
	table   string   // schema.table of its first WRITE_ROWS
	columns []string // that table map's column names; nil: written without (binlog_row_metadata MINIMAL)
}

var mysqlFiles = []mysqlFile{
	{name: "transaction_compression.000001", gtids: []string{""}, lastPos: 431, table: "test.tb1"},
	{name: "mysql-enum-string-set.000001", gtids: seqGTIDs("93e95066-a2f4-11ec-9b69-9657f0ae95e2", 1, 5),
		lastPos: 3331, table: "mysql.t", columns: []string{"f1", "f2", "f3", "f4", "f5"}},
	{name: "binlog-invisible-columns.000001", gtids: seqGTIDs("97c7af02-4c50-11ec-acd8-681842034964", 1, 5),
		lastPos: 1787, table: "mysql.t1", columns: []string{"f1", "f2", "f3", "f4", "f5", "f6"}},
	{name: "mysql_type_bit.000001", gtids: seqGTIDs("fbda2ad0-7c46-11ec-ae30-4ef7efc81a2a", 1, 3),
		lastPos: 1001, table: "mysql.foo", columns: []string{"a", "b", "c"}},
	{name: "json.binlog.000001", gtids: make([]string, 8), lastPos: 4011, table: "mysql.t"},
	{name: "minimal_row_metadata.000001", gtids: []string{""}, lastPos: 451, table: "noria.t1"},
	{name: "time_issue.000001", gtids: []string{""}, lastPos: 428, table: "noria.t"},
	{name: "binlog_transaction_with_GTID_TAG.000001", from: "55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2",
		gtids: []string{"55778904-0299-11f1-b1b8-4ef0c4956feb:mytag:3"}, lastPos: 541, table: "test.orders"},
}

func seqGTIDs(sid string, from, to int) []string {
	var out []string
	for n := from; n <= to; n++ {
		out = append(out, fmt.Sprintf("%s:%d", sid, n))
	}
	return out
}

// TestMySQLFilesTransactions: every transaction of every file is committed
// once, in order, with its GTID (uuid:n, tagged, anonymous), the compressed
// one included; every rows event the headers count reaches the session.
func TestMySQLFilesTransactions(t *testing.T) {
	for _, f := range mysqlFiles {
		t.Run(f.name, func(t *testing.T) {
			data := readMySQLBinlog(t, f.name)
			evs := headerEvents(t, data)
			rowsEvents := 0
			for _, e := range evs {
				if isRowsEventType(e.typ) {
					rowsEvents++
				}
			}
			fromHeaders := headerGTIDs(evs)
			if len(fromHeaders) != len(f.gtids) {
				t.Fatalf("headers: %d transactions, test expects %d", len(fromHeaders), len(f.gtids))
			}
			h := &recorder{}
			s, err := decodeMySQLFile(t, f.name, data, "app", "outbox",
				position.Position{Flavor: FlavorMySQL, GTIDSet: f.from}, h)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if s.rowsEvents < rowsEvents {
				t.Errorf("the session read %d rows events, the headers count %d", s.rowsEvents, rowsEvents)
			}
			if len(h.commits) != len(fromHeaders) {
				t.Fatalf("%d commits, the headers hold %d transactions: %+v", len(h.commits), len(fromHeaders), h.commits)
			}
			for i, g := range fromHeaders {
				if g != "tagged" && g != f.gtids[i] {
					t.Errorf("transaction %d: the headers say GTID %q, test expects %q", i, g, f.gtids[i])
				}
			}
			want, err := position.ParseGTIDSet(FlavorMySQL, f.from)
			if err != nil {
				t.Fatal(err)
			}
			for i, pos := range h.commits {
				if g := f.gtids[i]; g != "" {
					if err := want.Update(g); err != nil {
						t.Fatal(err)
					}
				}
				if pos.GTIDSet != want.String() || pos.File != f.name || pos.Flavor != FlavorMySQL || h.counts[i] != 0 {
					t.Errorf("commit %d = %+v (%d rows), want GTID set %q in %s", i, pos, h.counts[i], want.String(), f.name)
				}
			}
			if h.commits[len(h.commits)-1].Pos != f.lastPos {
				t.Errorf("last commit at %d, want %d", h.commits[len(h.commits)-1].Pos, f.lastPos)
			}
		})
	}
}

// TestMySQLFilesColumnNames: a tailer pointed at the table of each file's
// first WRITE_ROWS (none of them an outbox table) reads the column names
// from the TABLE_MAP (inside the compressed payload too) and refuses the
// row loudly: a *SchemaError naming the missing column and the names the
// TABLE_MAP carries, or, written with binlog_row_metadata=MINIMAL, a
// *PreflightError asking for FULL. No row is handed on, no transaction
// committed past it.
func TestMySQLFilesColumnNames(t *testing.T) {
	for _, f := range mysqlFiles {
		t.Run(f.name, func(t *testing.T) {
			schema, table, _ := strings.Cut(f.table, ".")
			h := &recorder{}
			_, err := decodeMySQLFile(t, f.name, readMySQLBinlog(t, f.name), schema, table,
				position.Position{Flavor: FlavorMySQL, GTIDSet: f.from}, h)
			if len(h.rows) != 0 {
				t.Fatalf("rows handed on: %v", h.rows)
			}
			var (
				se *SchemaError
				pe *PreflightError
			)
			switch {
			case f.columns != nil:
				if !errors.As(err, &se) || se.Column != "id" || !slices.Equal(se.Columns, f.columns) ||
					se.Schema != schema || se.Table != table {
					t.Fatalf("want a SchemaError naming column id and the columns %q, got %v", f.columns, err)
				}
			default:
				if !errors.As(err, &pe) || pe.Check != CheckRowMetadata || !strings.Contains(pe.Problem, f.table) {
					t.Fatalf("want a PreflightError %s naming %s, got %v", CheckRowMetadata, f.table, err)
				}
			}
		})
	}
}

// TestMySQLFileTaggedAlreadyCommitted: a start position that holds the
// tagged GTID (uuid:tag:n) skips its transaction: the duplicate guard
// compares tagged GTIDs by uuid, tag and number.
func TestMySQLFileTaggedAlreadyCommitted(t *testing.T) {
	const name = "binlog_transaction_with_GTID_TAG.000001"
	for _, tc := range []struct {
		from    string
		commits int
	}{
		{"55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-3", 0},
		{"55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:other:1-3", 1}, // another tag
		{"55778904-0299-11f1-b1b8-4ef0c4956feb:1-13", 1},           // untagged numbers only
	} {
		h := &recorder{}
		if _, err := decodeMySQLFile(t, name, readMySQLBinlog(t, name), "app", "outbox",
			position.Position{Flavor: FlavorMySQL, GTIDSet: tc.from}, h); err != nil {
			t.Fatalf("from %s: %v", tc.from, err)
		}
		if len(h.commits) != tc.commits {
			t.Errorf("from %s: %d commits, want %d", tc.from, len(h.commits), tc.commits)
		}
	}
}
