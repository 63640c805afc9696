package mysqldouble

import (
	"encoding/binary"
	"fmt"
	"sort"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// Column is one column of a table as a TABLE_MAP describes it.
type Column struct {
	Name     string
	Type     byte   // mysql.MYSQL_TYPE_*
	Meta     []byte // the type's metadata bytes in the TABLE_MAP
	Nullable bool
	Unsigned bool // numeric columns: the SIGNEDNESS optional metadata
	// Collation of a character column (CHAR, VARCHAR, BINARY, TEXT,
	// BLOB): 255 utf8mb4_0900_ai_ci, 63 binary; 0 for other columns.
	Collation uint64
	Invisible bool // MySQL 8.0.23+ INVISIBLE column
}

// Table is a table's TABLE_MAP: its id in the binlog, names and columns.
type Table struct {
	ID            uint64
	Schema, Name  string
	Columns       []Column
	MinimalFormat bool // binlog_row_metadata=MINIMAL: no column names
}

// OutboxColumns are the outbox table's columns (docs/tables.md) as MySQL
// 8.0 writes them in a TABLE_MAP (utf8mb4: VARCHAR(n) holds 4n bytes).
func OutboxColumns() []Column {
	varchar := func(name string, chars int, null bool) Column {
		return Column{Name: name, Type: mysql.MYSQL_TYPE_VARCHAR, Meta: binary.LittleEndian.AppendUint16(nil, uint16(4*chars)),
			Nullable: null, Collation: 255}
	}
	dt := func(name string, null bool) Column {
		return Column{Name: name, Type: mysql.MYSQL_TYPE_DATETIME2, Meta: []byte{6}, Nullable: null}
	}
	return []Column{
		{Name: "id", Type: mysql.MYSQL_TYPE_LONGLONG, Unsigned: true},
		{Name: "message_id", Type: mysql.MYSQL_TYPE_STRING, Meta: []byte{mysql.MYSQL_TYPE_STRING, 16}, Collation: 63},
		varchar("partition_key", 255, false),
		varchar("exchange", 255, false),
		varchar("routing_key", 255, false),
		varchar("message_type", 255, false),
		{Name: "headers", Type: mysql.MYSQL_TYPE_JSON, Meta: []byte{4}, Nullable: true},
		{Name: "payload", Type: mysql.MYSQL_TYPE_BLOB, Meta: []byte{4}, Collation: 63},
		varchar("content_type", 100, false),
		dt("created_at", false),
		dt("available_at", true),
		dt("delivered_at", true),
		{Name: "attempts", Type: mysql.MYSQL_TYPE_LONG, Unsigned: true},
		varchar("last_error", 1024, true),
	}
}

// Optional metadata field types of a TABLE_MAP (binlog_row_metadata).
const (
	optSignedness       = 1
	optDefaultCharset   = 2
	optColumnCharset    = 3
	optColumnName       = 4
	optColumnVisibility = 12
)

func isNumeric(t byte) bool {
	switch t {
	case mysql.MYSQL_TYPE_TINY, mysql.MYSQL_TYPE_SHORT, mysql.MYSQL_TYPE_INT24, mysql.MYSQL_TYPE_LONG,
		mysql.MYSQL_TYPE_LONGLONG, mysql.MYSQL_TYPE_NEWDECIMAL, mysql.MYSQL_TYPE_FLOAT, mysql.MYSQL_TYPE_DOUBLE:
		return true
	}
	return false
}

// bitmap packs bits LSB first, as MySQL's null bitmaps.
func bitmap(bits []bool) []byte {
	b := make([]byte, (len(bits)+7)/8)
	for i, v := range bits {
		if v {
			b[i/8] |= 1 << (i % 8)
		}
	}
	return b
}

// msbBitmap packs bits MSB first, as the optional metadata's bitmaps.
func msbBitmap(bits []bool) []byte {
	b := make([]byte, (len(bits)+7)/8)
	for i, v := range bits {
		if v {
			b[i/8] |= 0x80 >> (i % 8)
		}
	}
	return b
}

// TableMap writes t's TABLE_MAP: table id 6, flags 2 (1: BIT_LEN_EXACT),
// schema and table (length, name, 0), column count, types, metadata,
// null bitmap, then the optional metadata: signedness of the numeric
// columns and the character columns' collations (both also MINIMAL), then
// (FULL) the column names and their visibility.
func (e *Encoder) TableMap(t Table) []byte {
	b := binary.LittleEndian.AppendUint64(nil, t.ID)[:6]
	b = binary.LittleEndian.AppendUint16(b, 1)
	b = append(b, byte(len(t.Schema)))
	b = append(append(b, t.Schema...), 0)
	b = append(b, byte(len(t.Name)))
	b = append(append(b, t.Name...), 0)
	b = append(b, mysql.PutLengthEncodedInt(uint64(len(t.Columns)))...)
	var meta []byte
	nulls := make([]bool, len(t.Columns))
	var signed, visible []bool
	for i, c := range t.Columns {
		b = append(b, c.Type)
		meta = append(meta, c.Meta...)
		nulls[i] = c.Nullable
		if isNumeric(c.Type) {
			signed = append(signed, c.Unsigned)
		}
		visible = append(visible, !c.Invisible)
	}
	b = append(b, mysql.PutLengthEncodedInt(uint64(len(meta)))...)
	b = append(b, meta...)
	b = append(b, bitmap(nulls)...)
	opt := func(tp byte, v []byte) {
		b = append(b, tp)
		b = append(b, mysql.PutLengthEncodedInt(uint64(len(v)))...)
		b = append(b, v...)
	}
	if len(signed) > 0 {
		opt(optSignedness, msbBitmap(signed))
	}
	if tp, v := charsetMetadata(t.Columns); v != nil {
		opt(tp, v)
	}
	if !t.MinimalFormat {
		var names []byte
		for _, c := range t.Columns {
			names = append(names, mysql.PutLengthEncodedInt(uint64(len(c.Name)))...)
			names = append(names, c.Name...)
		}
		opt(optColumnName, names)
		opt(optColumnVisibility, msbBitmap(visible))
	}
	return e.event(replication.TABLE_MAP_EVENT, 0, b)
}

// charsetMetadata is the character columns' collations in the shorter of
// MySQL's two forms: DEFAULT_CHARSET (the most used collation, then the
// index among character columns and collation of each other one) or
// COLUMN_CHARSET (every character column's collation). nil: no character
// columns.
func charsetMetadata(cols []Column) (byte, []byte) {
	var colls []uint64
	count := map[uint64]int{}
	for _, c := range cols {
		if c.Collation != 0 {
			colls = append(colls, c.Collation)
			count[c.Collation]++
		}
	}
	if len(colls) == 0 {
		return 0, nil
	}
	def := colls[0]
	for c, n := range count {
		if n > count[def] || n == count[def] && c < def {
			def = c
		}
	}
	dflt := mysql.PutLengthEncodedInt(def)
	var column []byte
	for i, c := range colls {
		if c != def {
			dflt = append(dflt, mysql.PutLengthEncodedInt(uint64(i))...)
			dflt = append(dflt, mysql.PutLengthEncodedInt(c)...)
		}
		column = append(column, mysql.PutLengthEncodedInt(c)...)
	}
	if len(column) < len(dflt) {
		return optColumnCharset, column
	}
	return optDefaultCharset, dflt
}

// WriteRows writes a WRITE_ROWS v2 event of rows (values in t's column
// order: nil for NULL, else the Go type encodeValue takes) for t; end marks
// the statement's last rows event (STMT_END_F). A value that does not fit
// its column is an error.
func (e *Encoder) WriteRows(t Table, end bool, rows ...[]any) ([]byte, error) {
	b := binary.LittleEndian.AppendUint64(nil, t.ID)[:6]
	var flags uint16
	if end {
		flags = 1
	}
	b = binary.LittleEndian.AppendUint16(b, flags)
	b = binary.LittleEndian.AppendUint16(b, 2) // extra data: just its own length
	n := len(t.Columns)
	b = append(b, mysql.PutLengthEncodedInt(uint64(n))...)
	// Every column present; MySQL sets the bitmap's spare bits too.
	for range (n + 7) / 8 {
		b = append(b, 0xff)
	}
	for r, row := range rows {
		if len(row) != n {
			return nil, fmt.Errorf("row %d has %d values, table %s has %d columns", r, len(row), t.Name, n)
		}
		nulls := make([]bool, n)
		for i, v := range row {
			nulls[i] = v == nil
		}
		b = append(b, bitmap(nulls)...)
		for i, v := range row {
			if v == nil {
				continue
			}
			var err error
			if b, err = encodeValue(b, t.Columns[i], v); err != nil {
				return nil, fmt.Errorf("row %d column %s: %w", r, t.Columns[i].Name, err)
			}
		}
	}
	return e.event(replication.WRITE_ROWS_EVENTv2, 0, b), nil
}

// encodeValue appends v in the row image form of column c: integers
// (BIGINT uint64, INT uint32) little-endian; strings and []byte with their
// length prefix (1 or 2 bytes for CHAR and VARCHAR by the column's size,
// the metadata's count for BLOB and TEXT, 4 for JSON); JSON from a map[string]string as MySQL's
// binary JSON; DATETIME2(6) from a time.Time.
func encodeValue(b []byte, c Column, v any) ([]byte, error) {
	switch c.Type {
	case mysql.MYSQL_TYPE_LONGLONG:
		x, ok := v.(uint64)
		if !ok {
			return nil, fmt.Errorf("want uint64, got %T", v)
		}
		return binary.LittleEndian.AppendUint64(b, x), nil
	case mysql.MYSQL_TYPE_LONG:
		x, ok := v.(uint32)
		if !ok {
			return nil, fmt.Errorf("want uint32, got %T", v)
		}
		return binary.LittleEndian.AppendUint32(b, x), nil
	case mysql.MYSQL_TYPE_STRING, mysql.MYSQL_TYPE_VARCHAR:
		s, err := text(v)
		if err != nil {
			return nil, err
		}
		max := int(c.Meta[1])
		if c.Type == mysql.MYSQL_TYPE_VARCHAR {
			max = int(binary.LittleEndian.Uint16(c.Meta))
		}
		if len(s) > max {
			return nil, fmt.Errorf("%d bytes, column holds %d", len(s), max)
		}
		if max > 255 {
			b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		} else {
			b = append(b, byte(len(s)))
		}
		return append(b, s...), nil
	case mysql.MYSQL_TYPE_BLOB:
		s, err := text(v)
		if err != nil {
			return nil, err
		}
		// The length takes meta[0] bytes (1 TINY, 2 BLOB/TEXT, 3 MEDIUM, 4 LONG).
		n := binary.LittleEndian.AppendUint32(nil, uint32(len(s)))
		return append(append(b, n[:c.Meta[0]]...), s...), nil
	case mysql.MYSQL_TYPE_JSON:
		obj, ok := v.(map[string]string)
		if !ok {
			return nil, fmt.Errorf("want map[string]string, got %T", v)
		}
		j := jsonObject(obj)
		return append(binary.LittleEndian.AppendUint32(b, uint32(len(j))), j...), nil
	case mysql.MYSQL_TYPE_DATETIME2:
		t, ok := v.(time.Time)
		if !ok {
			return nil, fmt.Errorf("want time.Time, got %T", v)
		}
		return appendDatetime2(b, t.UTC()), nil
	}
	return nil, fmt.Errorf("column type %d not supported by the double", c.Type)
}

func text(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case []byte:
		return string(x), nil
	}
	return "", fmt.Errorf("want string or []byte, got %T", v)
}

// appendDatetime2 appends a DATETIME(6): 5 bytes big-endian of
// ((year*13+month)<<22 | day<<17 | hour<<12 | minute<<6 | second) plus
// 0x8000000000, then the microseconds in 3 bytes big-endian.
func appendDatetime2(b []byte, t time.Time) []byte {
	ym := uint64(t.Year()*13 + int(t.Month()))
	v := ym<<22 | uint64(t.Day())<<17 | uint64(t.Hour())<<12 | uint64(t.Minute())<<6 | uint64(t.Second())
	v += 0x8000000000
	b = append(b, byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	us := uint32(t.Nanosecond() / 1000)
	return append(b, byte(us>>16), byte(us>>8), byte(us))
}

// jsonObject is obj in MySQL's binary JSON: a small object (type 0x00),
// element count 2, size 2, key entries (offset 2, length 2), value entries
// (type 1, offset 2: strings, type 0x0c), the keys, then the values
// (length as a variable-length integer of 7-bit groups, then the bytes).
// Keys are sorted by length, then bytes, as MySQL stores them.
func jsonObject(obj map[string]string) []byte {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if len(keys[i]) != len(keys[j]) {
			return len(keys[i]) < len(keys[j])
		}
		return keys[i] < keys[j]
	})
	n := len(keys)
	headerLen := 4 + 4*n + 3*n
	offset := headerLen
	var keyBytes, valBytes []byte
	keyEntries := make([]byte, 0, 4*n)
	for _, k := range keys {
		keyEntries = binary.LittleEndian.AppendUint16(keyEntries, uint16(offset+len(keyBytes)))
		keyEntries = binary.LittleEndian.AppendUint16(keyEntries, uint16(len(k)))
		keyBytes = append(keyBytes, k...)
	}
	valStart := offset + len(keyBytes)
	valEntries := make([]byte, 0, 3*n)
	for _, k := range keys {
		valEntries = append(valEntries, 0x0c)
		valEntries = binary.LittleEndian.AppendUint16(valEntries, uint16(valStart+len(valBytes)))
		valBytes = appendJSONLen(valBytes, len(obj[k]))
		valBytes = append(valBytes, obj[k]...)
	}
	size := valStart + len(valBytes)
	out := []byte{0x00}
	out = binary.LittleEndian.AppendUint16(out, uint16(n))
	out = binary.LittleEndian.AppendUint16(out, uint16(size))
	out = append(out, keyEntries...)
	out = append(out, valEntries...)
	out = append(out, keyBytes...)
	return append(out, valBytes...)
}

func appendJSONLen(b []byte, n int) []byte {
	for n >= 0x80 {
		b = append(b, byte(n&0x7f|0x80))
		n >>= 7
	}
	return append(b, byte(n))
}
