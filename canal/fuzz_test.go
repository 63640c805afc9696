package canal

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// FuzzRecordDecode feeds the row decoder's column conversions the values a
// producer controls, in every Go type go-mysql hands them over as (and some
// it never does), through the record mapping of a TABLE_MAP of the outbox.
// Properties: no panic; a value that cannot be read is a *SchemaError naming
// its column, never a silently wrong field; a record that decodes holds
// exactly the values given (the id reinterpreted from a signed BIGINT,
// message ids padded to 16 bytes, DATETIME text read back to the same
// microsecond), owns its bytes (no aliasing of the event buffer), and is no
// larger than its input. Seed corpus: testdata/fuzz/FuzzRecordDecode/.
func FuzzRecordDecode(f *testing.F) {
	m, err := mapColumns(outboxTableMap())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id uint64, kinds []byte, mid, headers, payload []byte,
		key, exchange, routingKey, msgType, contentType, created, available string) {
		kind := func(i int) byte {
			if i < len(kinds) {
				return kinds[i]
			}
			return 0
		}
		// Column order of outboxTableMap: payload, id, message_id,
		// partition_key, exchange, routing_key, message_type, headers,
		// content_type, created_at, available_at, delivered_at, attempts,
		// last_error.
		row := []any{bytes.Clone(payload), id, bytes.Clone(mid), key, exchange, routingKey, msgType,
			bytes.Clone(headers), contentType, created, available, nil, uint32(0), nil}
		signedID := kind(0)%2 == 1
		if signedID {
			row[1] = int64(id) // no signedness metadata: BIGINT UNSIGNED arrives signed
		}
		if kind(1)%2 == 1 {
			row[2] = string(mid) // a BINARY(n) as string
		}
		switch kind(2) % 3 { // headers: LONGTEXT bytes (MariaDB), JSON text (MySQL), NULL
		case 1:
			row[7] = string(headers)
		case 2:
			row[7] = nil
		}
		if kind(3)%2 == 1 {
			row[10] = nil // available_at NULL
		}
		// A value of a type go-mysql does not give for the column: the
		// table is not the outbox the map says it is.
		wrong := -1
		if c := int(kind(4)); c > 0 && c <= 10 {
			wrong = m.idx[c]
			row[wrong] = float32(1.5)
		}
		in := append([]any(nil), row...)

		rec, err := m.record(row, nil)
		if err != nil {
			var se *SchemaError
			if !errors.As(err, &se) || se.Column == "" {
				t.Fatalf("error %v (%T) is not a *SchemaError naming a column", err, err)
			}
			if wrong < 0 && se.Column != "message_id" && se.Column != "created_at" && se.Column != "available_at" {
				t.Fatalf("column %s refused with values only go-mysql gives: %v", se.Column, err)
			}
			return
		}
		if wrong >= 0 {
			t.Fatalf("a %T in column %d was accepted", row[wrong], wrong)
		}
		if rec.ID != id {
			t.Fatalf("id %d (signed %v) decoded as %d", id, signedID, rec.ID)
		}
		if len(mid) > len(rec.MessageID) {
			t.Fatalf("a %d-byte message id was accepted", len(mid))
		}
		want := outbox.MessageID{}
		copy(want[:], mid)
		if rec.MessageID != want {
			t.Fatalf("message id %x decoded as %x", mid, rec.MessageID)
		}
		if rec.PartitionKey != key || rec.Exchange != exchange || rec.RoutingKey != routingKey ||
			rec.MessageType != msgType || rec.ContentType != contentType {
			t.Fatalf("strings changed: %+v", rec)
		}
		if in[7] == nil && rec.Headers != nil || in[7] != nil && !bytes.Equal(rec.Headers, headers) {
			t.Fatalf("headers %q (%T) decoded as %q", headers, in[7], rec.Headers)
		}
		if rec.Payload == nil || !bytes.Equal(rec.Payload, payload) {
			t.Fatalf("payload %q decoded as %q", payload, rec.Payload)
		}
		checkTime(t, "created_at", created, rec.CreatedAt)
		if in[10] == nil {
			if !rec.AvailableAt.IsZero() {
				t.Fatalf("NULL available_at decoded as %v", rec.AvailableAt)
			}
		} else {
			checkTime(t, "available_at", available, rec.AvailableAt)
		}
		// The record owns its bytes: the event buffer is reused.
		for _, v := range in {
			if b, ok := v.([]byte); ok {
				for i := range b {
					b[i] ^= 0xff
				}
			}
		}
		if !bytes.Equal(rec.Payload, payload) || in[7] != nil && !bytes.Equal(rec.Headers, headers) {
			t.Fatal("the record aliases the row's buffers")
		}
		if limit := len(payload) + len(headers) + len(key) + len(exchange) + len(routingKey) + len(msgType) +
			len(contentType) + outbox.RecordOverhead + 96; rec.Size() > limit {
			t.Fatalf("record size %d, input %d", rec.Size(), limit)
		}
	})
}

// checkTime holds a decoded DATETIME to the text it came from: a zero date
// is the zero time, anything else reads back to the same microsecond, in
// UTC.
func checkTime(t *testing.T, col, text string, got time.Time) {
	t.Helper()
	if strings.HasPrefix(text, "0000-00-00") && isDatetimeText(text) {
		if !got.IsZero() {
			t.Fatalf("%s %q decoded as %v, want the zero time", col, text, got)
		}
		return
	}
	if got.Location() != time.UTC {
		t.Fatalf("%s %q decoded in %v", col, text, got.Location())
	}
	if got.Nanosecond()%1000 != 0 {
		t.Fatalf("%s %q decoded as %v: finer than a microsecond", col, text, got)
	}
	back, err := time.ParseInLocation(datetimeLayout, got.Format(datetimeLayout), time.UTC)
	if err != nil || !back.Equal(got) {
		t.Fatalf("%s %q decoded as %v, which prints as %q and reads back as %v (%v)",
			col, text, got, got.Format(datetimeLayout), back, err)
	}
}
