package mysqldouble

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/google/uuid"
	"github.com/klauspost/compress/zstd"
)

// Event layout as MySQL 8.0 / 8.4 writes it (libbinlogevents): a 19-byte
// header (timestamp 4, type 1, server_id 4, event_size 4, log_pos 4,
// flags 2), the body, and a CRC32 of both when binlog_checksum=CRC32.
const (
	HeaderLen = 19
	// FlagArtificial is LOG_EVENT_ARTIFICIAL_F: the fake ROTATE a dump
	// starts with.
	FlagArtificial = 0x20
	// serverVersionLen is the fixed width of the FORMAT_DESCRIPTION's
	// server version.
	serverVersionLen = 50
	// logEventSuppressUse is LOG_EVENT_SUPPRESS_USE_F.
	logEventSuppressUse = 0x8
)

// PostHeaderLens80 and PostHeaderLens84 are the FORMAT_DESCRIPTION's
// post-header lengths of event types 1..41 (8.0.32) and 1..42 (9.6.0; 8.3+
// added GTID_TAGGED_LOG_EVENT and dropped the v1 rows events), copied from
// the FORMAT_DESCRIPTION events of canal/testdata/mysql-binlogs (a canal
// test compares them).
var (
	PostHeaderLens80 = []byte{
		0x00, 0x0d, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x04, 0x00, 0x00, 0x00, 0x62, 0x00, 0x04, 0x1a, 0x08, 0x00,
		0x00, 0x00, 0x08, 0x08, 0x08, 0x02, 0x00, 0x00, 0x00, 0x0a, 0x0a, 0x0a, 0x2a, 0x2a, 0x00, 0x12, 0x34, 0x00, 0x0a, 0x28, 0x00,
	}
	PostHeaderLens84 = []byte{
		0x00, 0x0d, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x04, 0x00, 0x00, 0x00, 0x63, 0x00, 0x04, 0x1a, 0x08, 0x00,
		0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x0a, 0x0a, 0x0a, 0x2a, 0x2a, 0x00, 0x12, 0x34, 0x00, 0x0a, 0x28, 0x00, 0x00,
	}
)

// Encoder writes the events of one binlog file: it keeps the log_pos
// (the end of each event in the file) and the server id.
type Encoder struct {
	ServerID uint32
	ThreadID uint32    // the QUERY events' thread id
	Time     time.Time // the events' timestamp
	pos      uint32
}

// NewEncoder starts a file: the next event is at offset 4, after the magic.
func NewEncoder(serverID uint32) *Encoder {
	return &Encoder{ServerID: serverID, Time: time.Unix(1700000000, 0), pos: 4}
}

// Pos is the end of the last event written: the file's size.
func (e *Encoder) Pos() uint32 { return e.pos }

// SetPos places the next event at offset pos of the file.
func (e *Encoder) SetPos(pos uint32) { e.pos = pos }

// event frames body as an event of type tp at the file's end, checksummed.
func (e *Encoder) event(tp replication.EventType, flags uint16, body []byte) []byte {
	raw := e.frame(tp, flags, body, true)
	e.pos += uint32(len(raw))
	binary.LittleEndian.PutUint32(raw[13:], e.pos)
	binary.LittleEndian.PutUint32(raw[len(raw)-4:], crc32.ChecksumIEEE(raw[:len(raw)-4]))
	return raw
}

// frame builds the header and body (and room for a checksum); log_pos 0.
func (e *Encoder) frame(tp replication.EventType, flags uint16, body []byte, checksum bool) []byte {
	size := HeaderLen + len(body)
	if checksum {
		size += 4
	}
	raw := make([]byte, HeaderLen, size)
	binary.LittleEndian.PutUint32(raw[0:], uint32(e.Time.Unix()))
	raw[4] = byte(tp)
	binary.LittleEndian.PutUint32(raw[5:], e.ServerID)
	binary.LittleEndian.PutUint32(raw[9:], uint32(size))
	binary.LittleEndian.PutUint16(raw[17:], flags)
	raw = append(raw, body...)
	if checksum {
		raw = append(raw, 0, 0, 0, 0)
	}
	return raw
}

// FormatDescription is the file's first event (binlog version 4, CRC32,
// create timestamp 0) with postHeaderLens (PostHeaderLens80 or
// PostHeaderLens84).
func (e *Encoder) FormatDescription(serverVersion string, postHeaderLens []byte) []byte {
	body := make([]byte, 2+serverVersionLen+4, 2+serverVersionLen+4+1+len(postHeaderLens)+1)
	binary.LittleEndian.PutUint16(body, 4)
	copy(body[2:2+serverVersionLen], serverVersion)
	body = append(body, HeaderLen)
	body = append(body, postHeaderLens...)
	body = append(body, byte(replication.BINLOG_CHECKSUM_ALG_CRC32))
	return e.event(replication.FORMAT_DESCRIPTION_EVENT, 0, body)
}

// PreviousGTIDs lists the transactions of the files before this one.
func (e *Encoder) PreviousGTIDs(set *mysql.MysqlGTIDSet) []byte {
	return e.event(replication.PREVIOUS_GTIDS_EVENT, 0, set.Encode())
}

// Rotate names the next file. A dump's first, fake, ROTATE is
// FakeRotate.
func (e *Encoder) Rotate(next string) []byte {
	body := binary.LittleEndian.AppendUint64(nil, 4)
	return e.event(replication.ROTATE_EVENT, 0, append(body, next...))
}

// FakeRotate is the ROTATE a dump starts with: artificial, log_pos 0,
// without a checksum (the replica declared itself checksum-aware).
func FakeRotate(serverID uint32, file string, pos uint64) []byte {
	e := &Encoder{ServerID: serverID}
	body := binary.LittleEndian.AppendUint64(nil, pos)
	return e.frame(replication.ROTATE_EVENT, FlagArtificial, append(body, file...), false)
}

// Heartbeat is a HEARTBEAT_LOG_EVENT (a dump's, not in the file):
// timestamp 0, artificial, naming the file the dump is at, log_pos its
// position.
func (e *Encoder) Heartbeat(file string) []byte {
	raw := e.frame(replication.HEARTBEAT_EVENT, FlagArtificial, []byte(file), true)
	binary.LittleEndian.PutUint32(raw[0:], 0)
	binary.LittleEndian.PutUint32(raw[13:], e.pos)
	binary.LittleEndian.PutUint32(raw[len(raw)-4:], crc32.ChecksumIEEE(raw[:len(raw)-4]))
	return raw
}

// GTID is what a GTID event carries. A zero SID is an anonymous GTID
// (gtid_mode OFF); a Tag makes it a GTID_TAGGED_LOG_EVENT (8.3+).
type GTID struct {
	SID            uuid.UUID
	Tag            string
	GNO            int64
	LastCommitted  int64
	SequenceNumber int64
	CommitTime     time.Time // immediate_commit_timestamp (original = immediate)
	Length         uint64    // transaction_length: this event to the end of the XID
	ServerVersion  uint32    // immediate_server_version, e.g. 80032
}

// gtidBody is the body of a GTID (or ANONYMOUS_GTID) event: flags 1, sid
// 16, gno 8, logical timestamps (typecode 2, last_committed 8,
// sequence_number 8), immediate_commit_timestamp 7 (original equals it:
// high bit clear), transaction_length (packed integer),
// immediate_server_version 4 (original equals it: high bit clear).
func gtidBody(g GTID, flags byte) []byte {
	b := []byte{flags}
	b = append(b, g.SID[:]...)
	b = binary.LittleEndian.AppendUint64(b, uint64(g.GNO))
	b = append(b, 2)
	b = binary.LittleEndian.AppendUint64(b, uint64(g.LastCommitted))
	b = binary.LittleEndian.AppendUint64(b, uint64(g.SequenceNumber))
	ts := binary.LittleEndian.AppendUint64(nil, uint64(g.CommitTime.UnixMicro()))
	b = append(b, ts[:7]...)
	b = append(b, mysql.PutLengthEncodedInt(g.Length)...)
	return binary.LittleEndian.AppendUint32(b, g.ServerVersion)
}

// gtidBodyOf is the body GTIDEvent writes for g.
func gtidBodyOf(g GTID, flags byte) []byte {
	if g.Tag != "" {
		return taggedBody(g, flags)
	}
	return gtidBody(g, flags)
}

// GTIDEvent writes g's GTID, ANONYMOUS_GTID or GTID_TAGGED event. flags is
// the event's first byte: MySQL writes 0 for a row-based transaction and 1
// (FLAG_MAY_HAVE_SBR) for DDL.
func (e *Encoder) GTIDEvent(g GTID, flags byte) []byte {
	switch {
	case g.Tag != "":
		return e.event(replication.GTID_TAGGED_LOG_EVENT, 0, taggedBody(g, flags))
	case g.SID == uuid.Nil:
		return e.event(replication.ANONYMOUS_GTID_EVENT, 0, gtidBody(g, flags))
	default:
		return e.event(replication.GTID_EVENT, 0, gtidBody(g, flags))
	}
}

// taggedBody is GTID_TAGGED_LOG_EVENT's body in mysql::serialization's
// form: serializable version 1, the message size, the last non-ignorable
// field (0), then each field's id and value, varlen-encoded (fixed-width
// fields byte by byte); fields 7, 10 and 11 (original commit timestamp and
// server version, equal to the immediate ones, and the commit group
// ticket) are left out, as MySQL leaves them out.
func taggedBody(g GTID, flags byte) []byte {
	var msg []byte
	msg = appendFixed(appendVarlen(msg, 0), []byte{flags})
	msg = appendFixed(appendVarlen(msg, 1), g.SID[:])
	msg = appendVarlenSigned(appendVarlen(msg, 2), g.GNO)
	msg = append(appendVarlen(appendVarlen(msg, 3), uint64(len(g.Tag))), g.Tag...)
	msg = appendVarlenSigned(appendVarlen(msg, 4), g.LastCommitted)
	msg = appendVarlenSigned(appendVarlen(msg, 5), g.SequenceNumber)
	msg = appendVarlen(appendVarlen(msg, 6), uint64(g.CommitTime.UnixMicro()))
	msg = appendVarlen(appendVarlen(msg, 8), g.Length)
	msg = appendVarlen(appendVarlen(msg, 9), uint64(g.ServerVersion))
	size := uint64(1 + 1 + len(msg)) // version, last non-ignorable field, fields
	size += uint64(varlenLen(size + 1))
	head := appendVarlen(appendVarlen(nil, 1), size)
	return append(appendVarlen(head, 0), msg...)
}

// appendFixed appends a fixed-width field: each byte varlen-encoded.
func appendFixed(b, v []byte) []byte {
	for _, x := range v {
		b = appendVarlen(b, uint64(x))
	}
	return b
}

// Query writes a QUERY event with the status variables MySQL 8.0 writes
// for BEGIN (flags2, sql_mode, catalog, charsets, default collation for
// utf8mb4) and LOG_EVENT_SUPPRESS_USE_F.
func (e *Encoder) Query(db, query string) []byte {
	status := []byte{
		0x00, 0x00, 0x00, 0x00, 0x00, // Q_FLAGS2_CODE
		0x01, 0x20, 0x00, 0xa0, 0x45, 0x00, 0x00, 0x00, 0x00, // Q_SQL_MODE_CODE
		0x06, 0x03, 's', 't', 'd', // Q_CATALOG_NZ_CODE "std"
		0x04, 0xff, 0x00, 0xff, 0x00, 0xff, 0x00, // Q_CHARSET_CODE utf8mb4_0900_ai_ci x3
		0x12, 0xff, 0x00, // Q_DEFAULT_COLLATION_FOR_UTF8MB4
	}
	body := binary.LittleEndian.AppendUint32(nil, e.ThreadID)
	body = binary.LittleEndian.AppendUint32(body, 0) // exec time
	body = append(body, byte(len(db)))
	body = binary.LittleEndian.AppendUint16(body, 0) // error code
	body = binary.LittleEndian.AppendUint16(body, uint16(len(status)))
	body = append(body, status...)
	body = append(body, db...)
	body = append(body, 0)
	body = append(body, query...)
	return e.event(replication.QUERY_EVENT, logEventSuppressUse, body)
}

// XID commits a transaction.
func (e *Encoder) XID(xid uint64) []byte {
	return e.event(replication.XID_EVENT, 0, binary.LittleEndian.AppendUint64(nil, xid))
}

// Payload compresses a transaction's events (those after its GTID event,
// written by an Encoder whose positions are discarded: MySQL leaves the
// inner events' log_pos 0 and their checksums out) into one
// TRANSACTION_PAYLOAD event, zstd, as binlog_transaction_compression=ON
// writes it.
func (e *Encoder) Payload(inner ...[]byte) ([]byte, error) {
	raw := bytes.Join(inner, nil)
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	compressed := enc.EncodeAll(raw, nil)
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	var body []byte
	field := func(tp byte, v uint64) {
		enc := mysql.PutLengthEncodedInt(v)
		body = append(body, tp, byte(len(enc)))
		body = append(body, enc...)
	}
	// MySQL's order: compression type, uncompressed size, payload size.
	field(replication.OTW_PAYLOAD_COMPRESSION_TYPE_FIELD, replication.ZSTD)
	field(replication.OTW_PAYLOAD_UNCOMPRESSED_SIZE_FIELD, uint64(len(raw)))
	field(replication.OTW_PAYLOAD_SIZE_FIELD, uint64(len(compressed)))
	body = append(body, replication.OTW_PAYLOAD_HEADER_END_MARK)
	body = append(body, compressed...)
	return e.event(replication.TRANSACTION_PAYLOAD_EVENT, 0, body), nil
}

// Inner is an Encoder for the events inside a TRANSACTION_PAYLOAD: no
// checksums, log_pos 0.
type Inner struct{ e Encoder }

// NewInner returns an encoder of payload events.
func NewInner(serverID uint32) *Inner {
	return &Inner{e: Encoder{ServerID: serverID, Time: time.Unix(1700000000, 0)}}
}

func (in *Inner) event(tp replication.EventType, body []byte) []byte {
	return in.e.frame(tp, 0, body, false)
}

// strip removes the checksum and log_pos of an event the Encoder wrote.
func strip(raw []byte) []byte {
	out := append([]byte(nil), raw[:len(raw)-4]...)
	binary.LittleEndian.PutUint32(out[9:], uint32(len(out)))
	binary.LittleEndian.PutUint32(out[13:], 0)
	return out
}

// Of re-frames events an Encoder wrote as payload events.
func (in *Inner) Of(raws ...[]byte) [][]byte {
	out := make([][]byte, len(raws))
	for i, r := range raws {
		out[i] = strip(r)
	}
	return out
}

// appendVarlen appends v in mysql::serialization's variable-length
// unsigned form: the count of trailing bytes as the number of low one
// bits of the first byte.
func appendVarlen(b []byte, v uint64) []byte {
	n := varlenLen(v)
	if n == 9 {
		b = append(b, 0xff)
		return binary.LittleEndian.AppendUint64(b, v)
	}
	x := v<<n | (1<<(n-1) - 1)
	for i := range n {
		b = append(b, byte(x>>(8*i)))
	}
	return b
}

// appendVarlenSigned zig-zags v, then appends it as unsigned.
func appendVarlenSigned(b []byte, v int64) []byte {
	return appendVarlen(b, uint64(v<<1)^uint64(v>>63))
}

// varlenLen is the encoded length of v: 1 byte holds 7 bits, each more 7 more.
func varlenLen(v uint64) int {
	for n := 1; n <= 8; n++ {
		if v < 1<<(7*n) {
			return n
		}
	}
	return 9
}
