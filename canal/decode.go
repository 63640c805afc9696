package canal

import (
	"fmt"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Indexes into columnMap.idx, one per outbox column the Record needs.
const (
	colID = iota
	colMessageID
	colPartitionKey
	colExchange
	colRoutingKey
	colMessageType
	colHeaders
	colPayload
	colContentType
	colCreatedAt
	colAvailableAt
	numCols
)

// requiredColumns are the outbox columns (docs/tables.md) the Record is built
// from, in col* order. Other columns (delivered_at, attempts, ...) are ignored.
var requiredColumns = [numCols]string{
	"id", "message_id", "partition_key", "exchange", "routing_key", "message_type",
	"headers", "payload", "content_type", "created_at", "available_at",
}

// columnMap is where each required column sits in one TABLE_MAP.
type columnMap struct {
	tme *replication.TableMapEvent
	idx [numCols]int
}

// mapColumns locates the required columns in tme by name. The names come from
// the TABLE_MAP's optional metadata, i.e. the table as it was when the event
// was written, never from the live schema (which may already have changed).
func mapColumns(tme *replication.TableMapEvent) (*columnMap, error) {
	names := tme.ColumnNameString()
	schema, table := string(tme.Schema), string(tme.Table)
	if len(names) == 0 {
		return nil, &PreflightError{
			Check:   CheckRowMetadata,
			Problem: fmt.Sprintf("the binlog table map of %s.%s carries no column names (binlog_row_metadata is not FULL)", schema, table),
			Fix:     "set binlog_row_metadata=FULL (my.cnf [mysqld] binlog-row-metadata=FULL, or SET GLOBAL binlog_row_metadata='FULL')",
		}
	}
	m := &columnMap{tme: tme}
	for i := range m.idx {
		m.idx[i] = -1
	}
	for i, n := range names {
		for c, want := range requiredColumns {
			if strings.EqualFold(n, want) {
				m.idx[c] = i
			}
		}
	}
	for c, i := range m.idx {
		if i < 0 {
			return nil, &SchemaError{Schema: schema, Table: table, Column: requiredColumns[c]}
		}
	}
	// Types that the conversions below cannot read are a schema problem too;
	// catching them here names the column instead of failing on a value.
	check := func(c int, want string, ok func(t byte) bool) error {
		if t := tme.ColumnType[m.idx[c]]; !ok(t) {
			return &SchemaError{Schema: schema, Table: table, Column: requiredColumns[c],
				Reason: fmt.Sprintf("binlog column type %d, want %s", t, want)}
		}
		return nil
	}
	isInt := func(t byte) bool {
		return t == mysql.MYSQL_TYPE_LONGLONG || t == mysql.MYSQL_TYPE_LONG || t == mysql.MYSQL_TYPE_INT24
	}
	isBinary := func(t byte) bool { return t == mysql.MYSQL_TYPE_STRING }
	isVarchar := func(t byte) bool {
		return t == mysql.MYSQL_TYPE_VARCHAR || t == mysql.MYSQL_TYPE_VAR_STRING || t == mysql.MYSQL_TYPE_STRING
	}
	// MariaDB's JSON is LONGTEXT (a BLOB in the binlog); MySQL's is JSON.
	isBlob := func(t byte) bool { return t == mysql.MYSQL_TYPE_BLOB || t == mysql.MYSQL_TYPE_JSON }
	isTime := func(t byte) bool {
		return t == mysql.MYSQL_TYPE_DATETIME2 || t == mysql.MYSQL_TYPE_DATETIME ||
			t == mysql.MYSQL_TYPE_TIMESTAMP2 || t == mysql.MYSQL_TYPE_TIMESTAMP
	}
	for _, err := range []error{
		check(colID, "BIGINT UNSIGNED", isInt),
		check(colMessageID, "BINARY(16)", isBinary),
		check(colPartitionKey, "VARCHAR", isVarchar),
		check(colExchange, "VARCHAR", isVarchar),
		check(colRoutingKey, "VARCHAR", isVarchar),
		check(colMessageType, "VARCHAR", isVarchar),
		check(colHeaders, "JSON", isBlob),
		check(colPayload, "LONGBLOB", isBlob),
		check(colContentType, "VARCHAR", isVarchar),
		check(colCreatedAt, "DATETIME(6)", isTime),
		check(colAvailableAt, "DATETIME(6)", isTime),
	} {
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

// record converts one decoded WRITE_ROWS row image. skipped lists the columns
// the row image left out (binlog_row_image other than FULL).
//
// Strings and byte slices returned by go-mysql alias the event's packet
// buffer; they are copied so a Record held in flight pins only its own bytes
// (the in-flight limit counts Record.Size, not whole events).
func (m *columnMap) record(row []any, skipped []int) (*outbox.Record, error) {
	for _, s := range skipped {
		for c, i := range m.idx {
			if s == i {
				return nil, &PreflightError{
					Check: CheckRowImage,
					Problem: fmt.Sprintf("the binlog row of %s.%s lacks column %q (binlog_row_image is not FULL)",
						m.tme.Schema, m.tme.Table, requiredColumns[c]),
					Fix: "set binlog_row_image=FULL (my.cnf [mysqld] binlog-row-image=FULL, or SET GLOBAL binlog_row_image='FULL')",
				}
			}
		}
	}
	if len(row) < int(m.tme.ColumnCount) {
		return nil, &fatalError{fmt.Errorf("row has %d values, table map has %d columns", len(row), m.tme.ColumnCount)}
	}
	var (
		rec outbox.Record
		err error
	)
	field := func(c int) any { return row[m.idx[c]] }
	// A value of an unexpected type means the table is not the one the
	// tailer maps; re-reading cannot change that, so it is a SchemaError.
	fail := func(c int, e error) {
		if err == nil && e != nil {
			err = &SchemaError{Schema: string(m.tme.Schema), Table: string(m.tme.Table), Column: requiredColumns[c],
				Reason: "undecodable value: " + e.Error()}
		}
	}
	var e error
	rec.ID, e = toUint64(field(colID))
	fail(colID, e)
	rec.MessageID, e = toMessageID(field(colMessageID))
	fail(colMessageID, e)
	rec.PartitionKey, e = toString(field(colPartitionKey))
	fail(colPartitionKey, e)
	rec.Exchange, e = toString(field(colExchange))
	fail(colExchange, e)
	rec.RoutingKey, e = toString(field(colRoutingKey))
	fail(colRoutingKey, e)
	rec.MessageType, e = toString(field(colMessageType))
	fail(colMessageType, e)
	rec.Headers, e = toBytes(field(colHeaders), false)
	fail(colHeaders, e)
	rec.Payload, e = toBytes(field(colPayload), true)
	fail(colPayload, e)
	rec.ContentType, e = toString(field(colContentType))
	fail(colContentType, e)
	rec.CreatedAt, e = toTime(field(colCreatedAt))
	fail(colCreatedAt, e)
	rec.AvailableAt, e = toTime(field(colAvailableAt))
	fail(colAvailableAt, e)
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// toUint64 accepts every integer type go-mysql returns: unsigned types when
// the TABLE_MAP carries signedness (binlog_row_metadata MINIMAL or FULL),
// signed ones otherwise, in which case a BIGINT UNSIGNED above 2^63 arrives
// negative and is reinterpreted.
func toUint64(v any) (uint64, error) {
	switch x := v.(type) {
	case uint64:
		return x, nil
	case int64:
		return uint64(x), nil
	case uint32:
		return uint64(x), nil
	case int32:
		return uint64(uint32(x)), nil
	case nil:
		return 0, fmt.Errorf("NULL")
	default:
		return 0, fmt.Errorf("unexpected %T", v)
	}
}

// toMessageID reads a BINARY(16). The server strips trailing 0x00 bytes of
// BINARY(n) values in the binlog (about one UUID in 256 arrives short); the
// missing bytes are zeros, which the zero-initialised array already holds.
func toMessageID(v any) (outbox.MessageID, error) {
	var id outbox.MessageID
	var b []byte
	switch x := v.(type) {
	case string:
		if len(x) > len(id) {
			return id, fmt.Errorf("%d bytes, want at most 16", len(x))
		}
		copy(id[:], x)
		return id, nil
	case []byte:
		b = x
	case nil:
		return id, fmt.Errorf("NULL")
	default:
		return id, fmt.Errorf("unexpected %T", v)
	}
	if len(b) > len(id) {
		return id, fmt.Errorf("%d bytes, want at most 16", len(b))
	}
	copy(id[:], b)
	return id, nil
}

func toString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return strings.Clone(x), nil
	case []byte:
		return string(x), nil
	case nil:
		return "", nil // NOT NULL columns; a NULL would only come from a changed table
	default:
		return "", fmt.Errorf("unexpected %T", v)
	}
}

// toBytes copies a BLOB or JSON value. MariaDB's JSON (LONGTEXT) arrives as
// []byte text; MySQL's binary JSON is rendered to text by go-mysql and
// arrives as a string. NULL is nil unless notNull, then an empty slice.
func toBytes(v any, notNull bool) ([]byte, error) {
	switch x := v.(type) {
	case []byte:
		return append(make([]byte, 0, len(x)), x...), nil
	case string:
		return []byte(x), nil
	case nil:
		if notNull {
			return []byte{}, nil
		}
		return nil, nil
	default:
		return nil, fmt.Errorf("unexpected %T", v)
	}
}

// datetimeLayout is the text go-mysql gives for DATETIME values it does not
// turn into time.Time (zero dates, years before 1970).
const datetimeLayout = "2006-01-02 15:04:05.999999"

// toTime reads a DATETIME(6) as UTC with microseconds. NULL and zero dates
// ('0000-00-00 …') are the zero time. Text not in the server's DATETIME
// form ("YYYY-MM-DD hh:mm:ss" and up to six fractional digits) is an error:
// time.Parse alone would also take a comma, one-digit hours or nanoseconds.
func toTime(v any) (time.Time, error) {
	switch x := v.(type) {
	case time.Time:
		return x.UTC(), nil
	case string:
		if !isDatetimeText(x) {
			return time.Time{}, fmt.Errorf("%q is not a DATETIME (YYYY-MM-DD hh:mm:ss[.ffffff])", x)
		}
		if strings.HasPrefix(x, "0000-00-00") {
			return time.Time{}, nil
		}
		t, err := time.ParseInLocation(datetimeLayout, x, time.UTC)
		if err != nil {
			return time.Time{}, err
		}
		return t, nil
	case nil:
		return time.Time{}, nil
	default:
		return time.Time{}, fmt.Errorf("unexpected %T", v)
	}
}

// isDatetimeText reports whether s has the form the server writes a
// DATETIME in: "YYYY-MM-DD hh:mm:ss", then optionally '.' and one to six
// digits.
func isDatetimeText(s string) bool {
	const form = "dddd-dd-dd dd:dd:dd"
	if len(s) < len(form) || len(s) == len(form)+1 || len(s) > len(form)+7 {
		return false
	}
	for i := range len(s) {
		want := byte('d')
		switch {
		case i < len(form):
			want = form[i]
		case i == len(form):
			want = '.'
		}
		if want == 'd' && (s[i] < '0' || s[i] > '9') || want != 'd' && s[i] != want {
			return false
		}
	}
	return true
}
