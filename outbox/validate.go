package outbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits enforced before anything is written. The VARCHAR(255) columns would
// take 255 characters, but AMQP short strings (exchange, routing key, type,
// header names) are limited to 255 bytes, so bytes is the binding limit.
const (
	MaxKeyLen         = 255 // bytes: PartitionKey, Exchange, RoutingKey, MessageType, header names
	MaxContentTypeLen = 100 // bytes: ContentType (VARCHAR(100))
)

// DefaultContentType is stored when Message.ContentType is empty.
const DefaultContentType = "application/json"

// DATETIME's range in Unix seconds, [1000-01-01, 10000-01-01): a time
// outside it would be rejected (or, in a lenient sql_mode, silently zeroed)
// by the server.
const (
	minDatetimeUnix = -30610224000
	maxDatetimeUnix = 253402300800
)

// reservedHeader reports whether name is one the relay sets on the wire
// (docs/wire.md); letting producers set them would make them ambiguous.
// Compared case-insensitively: AMQP tables are case-sensitive, but
// "X-Outbox-Id" next to "x-outbox-id" would only confuse consumers.
func reservedHeader(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "x-outbox-") || strings.HasPrefix(n, "x-relay-") ||
		n == "x-partition-key" || n == "x-replay" || n == "x-created-at"
}

// prepared is a validated message in the form it is inserted.
type prepared struct {
	headers     any // nil (NULL) or JSON text as string
	contentType string
	availableAt any // nil (NULL) or "YYYY-MM-DD hh:mm:ss.ffffff" in UTC
	size        int // approximate bytes this row adds to the statement
}

// prepare validates m (the i-th message of the call) and converts it.
func prepare(i int, m *Message) (prepared, error) {
	var p prepared
	bad := func(field, reason string, sentinel error) error {
		return &ValidationError{Index: i, Field: field, Reason: reason, Err: sentinel}
	}
	if m.RoutingKey == "" {
		return p, bad("RoutingKey", "must not be empty", ErrEmptyRoutingKey)
	}
	for _, f := range [...]struct {
		name, value string
		max         int
	}{
		{"PartitionKey", m.PartitionKey, MaxKeyLen},
		{"Exchange", m.Exchange, MaxKeyLen},
		{"RoutingKey", m.RoutingKey, MaxKeyLen},
		{"MessageType", m.MessageType, MaxKeyLen},
		{"ContentType", m.ContentType, MaxContentTypeLen},
	} {
		if len(f.value) > f.max {
			return p, bad(f.name, fmt.Sprintf("%d bytes, at most %d allowed", len(f.value), f.max), ErrTooLong)
		}
		if !utf8.ValidString(f.value) {
			return p, bad(f.name, "not valid UTF-8", ErrInvalidUTF8)
		}
	}
	p.contentType = m.ContentType
	if p.contentType == "" {
		p.contentType = DefaultContentType
	}
	if !m.AvailableAt.IsZero() {
		t := m.AvailableAt.UTC()
		if sec := t.Unix(); sec < minDatetimeUnix || sec >= maxDatetimeUnix {
			return p, bad("AvailableAt", fmt.Sprintf("%s is outside the DATETIME range", t.Format(time.RFC3339)), ErrBadAvailableAt)
		}
		// A string, not a time.Time: the driver would convert a time.Time to
		// the DSN's loc, and the column must hold UTC whatever the DSN says.
		p.availableAt = t.Format("2006-01-02 15:04:05.000000")
	}
	if len(m.Headers) > 0 {
		h, err := encodeHeaders(i, m.Headers)
		if err != nil {
			return p, err
		}
		p.headers = h
	}
	p.size = 64 + len(m.PartitionKey) + len(m.Exchange) + len(m.RoutingKey) + len(m.MessageType) +
		len(p.contentType) + len(m.Payload)
	if s, ok := p.headers.(string); ok {
		p.size += len(s)
	}
	return p, nil
}

// encodeHeaders checks that h is a flat map of scalar values and returns its
// JSON object text, keys sorted (deterministic, so equal headers store equal
// text).
//
// Values are normalised through reflect before encoding: a named type such as
// `type Priority int` is accepted as an int, and its MarshalJSON or String
// methods, if any, are ignored, so what is stored is always a plain JSON
// scalar the relay can turn into an AMQP header.
func encodeHeaders(i int, h map[string]any) (string, error) {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)

	var buf bytes.Buffer
	buf.WriteByte('{')
	for n, k := range keys {
		field := "Headers[" + strconv.Quote(k) + "]"
		bad := func(reason string, sentinel error) error {
			return &ValidationError{Index: i, Field: field, Reason: reason, Err: sentinel}
		}
		switch {
		case k == "":
			return "", bad("header name must not be empty", ErrBadHeaders)
		case len(k) > MaxKeyLen:
			return "", bad(fmt.Sprintf("header name is %d bytes, at most %d allowed", len(k), MaxKeyLen), ErrTooLong)
		case !utf8.ValidString(k):
			return "", bad("header name is not valid UTF-8", ErrInvalidUTF8)
		case reservedHeader(k):
			return "", bad("header name is reserved: the relay sets x-outbox-*, x-relay-*, x-partition-key, x-created-at and x-replay itself", ErrReservedHeader)
		}
		v, err := headerValue(h[k])
		if err != nil {
			return "", bad(err.Error(), ErrBadHeaders)
		}
		if s, ok := v.(string); ok && !utf8.ValidString(s) {
			return "", bad("value is not valid UTF-8", ErrInvalidUTF8)
		}
		if n > 0 {
			buf.WriteByte(',')
		}
		if err := writeJSON(&buf, k); err != nil {
			return "", bad(err.Error(), ErrBadHeaders)
		}
		buf.WriteByte(':')
		if err := writeJSON(&buf, v); err != nil {
			return "", bad(err.Error(), ErrBadHeaders)
		}
	}
	buf.WriteByte('}')
	return buf.String(), nil
}

// headerValue returns v as one of string, bool, int64, uint64, float64 or
// json.Number, or an error saying why it is not allowed.
func headerValue(v any) (any, error) {
	if v == nil {
		return nil, fmt.Errorf("value is nil; headers take string, number or bool values")
	}
	if n, ok := v.(json.Number); ok {
		// json.Number is written unquoted: it must really be a number literal
		// (the encoder checks the grammar; "" it would turn into 0).
		if _, err := json.Marshal(n); err != nil || n == "" {
			return nil, fmt.Errorf("json.Number %q is not a number", string(n))
		}
		return n, nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.String:
		return rv.String(), nil
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return rv.Uint(), nil
	case reflect.Float32, reflect.Float64:
		f := rv.Float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("value %v is not representable in JSON", f)
		}
		if rv.Kind() == reflect.Float32 {
			// Format with float32 precision so 0.1 stays 0.1, not 0.10000000149011612.
			return json.Number(strconv.FormatFloat(f, 'g', -1, 32)), nil
		}
		return f, nil
	default:
		return nil, fmt.Errorf("value of type %T is not allowed; headers are a flat object of string, number or bool values", v)
	}
}

// writeJSON encodes v without HTML escaping (headers are not HTML, and
// "<" stored as "\u003c" would only make the column harder to read).
func writeJSON(buf *bytes.Buffer, v any) error {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - 1) // Encode appends a newline
	return nil
}
