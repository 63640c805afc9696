package publish_test

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
)

func baseRecord() *outbox.Record {
	id, _ := outbox.ParseMessageID("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
	return &outbox.Record{
		ID:           42,
		MessageID:    id,
		PartitionKey: "order-7",
		Exchange:     "orders",
		RoutingKey:   "order.placed",
		MessageType:  "order.placed",
		Payload:      []byte(`{"total":3}`),
		ContentType:  "application/json",
		CreatedAt:    time.Date(2026, 5, 1, 12, 30, 45, 123456000, time.UTC),
	}
}

func TestFromRecordWireMessage(t *testing.T) {
	rec := baseRecord()
	rec.Headers = []byte(`{"tenant":"acme","n":3,"neg":-7,"big":9007199254740993,"exp":1e3,"two":2.0,"ratio":0.25,"ok":true,"no":false,"x-replay":true,"x-outbox-id":"spoofed","x-created-at":"spoofed"}`)
	m, err := publish.FromRecord(rec, "default-ex", 9, false)
	if err != nil {
		t.Fatal(err)
	}
	want := amqp.Publishing{
		Headers: amqp.Table{
			"tenant": "acme", "n": int64(3), "neg": int64(-7), "big": int64(9007199254740993),
			"exp": int64(1000), "two": int64(2), "ratio": 0.25, "ok": true, "no": false,
			"x-outbox-id": int64(42), "x-partition-key": "order-7", "x-relay-epoch": int64(9),
			"x-created-at": "2026-05-01T12:30:45.123456Z",
		},
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		MessageId:    "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
		Timestamp:    rec.CreatedAt,
		Type:         "order.placed",
		Body:         rec.Payload,
	}
	if m.Exchange != "orders" || m.RoutingKey != "order.placed" || m.Size != rec.Size() || m.Tag != nil {
		t.Errorf("FromRecord: exchange %q, routing key %q, size %d, tag %v", m.Exchange, m.RoutingKey, m.Size, m.Tag)
	}
	if !reflect.DeepEqual(m.Publishing, want) {
		t.Fatalf("FromRecord:\ngot  %#v\nwant %#v", m.Publishing, want)
	}
}

// x-created-at is created_at in RFC 3339 UTC with exactly six fractional
// digits, whatever the microseconds and the time's location.
func TestFromRecordCreatedAtHeader(t *testing.T) {
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{time.Date(2026, 11, 23, 13, 45, 1, 123456000, time.UTC), "2026-11-23T13:45:01.123456Z"},
		{time.Date(2026, 11, 23, 13, 45, 1, 0, time.UTC), "2026-11-23T13:45:01.000000Z"},
		{time.Date(2026, 11, 23, 13, 45, 1, 100000, time.UTC), "2026-11-23T13:45:01.000100Z"},
		{time.Date(2026, 11, 23, 18, 45, 1, 999999000, time.FixedZone("+05", 5*3600)), "2026-11-23T13:45:01.999999Z"},
	} {
		rec := baseRecord()
		rec.CreatedAt = tc.at
		m, err := publish.FromRecord(rec, "", 1, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Publishing.Headers["x-created-at"]; got != tc.want {
			t.Errorf("created_at %s: x-created-at %v, want %s", tc.at, got, tc.want)
		}
		if !m.Publishing.Timestamp.Equal(tc.at) {
			t.Errorf("created_at %s: timestamp %s", tc.at, m.Publishing.Timestamp)
		}
	}
	// A zero created_at ('0000-00-00' in a lenient sql_mode) has no instant:
	// no timestamp property and no header.
	rec := baseRecord()
	rec.CreatedAt = time.Time{}
	m, err := publish.FromRecord(rec, "", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := m.Publishing.Headers["x-created-at"]; ok || !m.Publishing.Timestamp.IsZero() {
		t.Errorf("zero created_at: x-created-at %v, timestamp %s; want neither", v, m.Publishing.Timestamp)
	}
}

// The JSON → AMQP field mapping of docs/wire.md: every value is carried
// exactly; a number no int64 or double holds goes as its JSON text.
func TestFromRecordHeaderTypes(t *testing.T) {
	deep := func(n int, leaf string) string {
		return strings.Repeat(`{"d":`, n) + leaf + strings.Repeat(`}`, n)
	}
	nested := func(n int, leaf any) any {
		for range n {
			leaf = amqp.Table{"d": leaf}
		}
		return leaf
	}
	rec := baseRecord()
	rec.Headers = []byte(`{
		"s": "ünï ✓", "empty": "", "t": true, "f": false,
		"i": 3, "neg": -7, "zero": 0, "negzero": -0.0, "maxi": 9223372036854775807, "mini": -9223372036854775808,
		"intfloat": 9007199254740993.0, "exp": 2.5E+3, "scaled": 100e-2, "bigexp": 0e999999999999999999999,
		"ratio": 0.25, "tenth": 0.1, "pi": 3.141592653589793, "e21": 1e21, "small": 1.5e-300, "denorm": 5e-324,
		"u64": 18446744073709551615, "over": 9223372036854775808, "under": -9223372036854775809,
		"huge": 1e400, "tiny": 1e-400, "precise": 0.1000000000000000000001, "long": 12345678901234567890.5,
		"manydigits": 3.14159265358979323846, "hugeexp": 1e99999999999999999999,
		"null": null,
		"obj": {"a": 1, "b": [true, null, "x", 0.5, 18446744073709551615], "c": {}},
		"arr": [1, 2.5, "s", [], {"k": null}], "emptyarr": [],
		"deep32": ` + deep(31, `{"leaf":1}`) + `
	}`)
	m, err := publish.FromRecord(rec, "", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	want := amqp.Table{
		"s": "ünï ✓", "empty": "", "t": true, "f": false,
		"i": int64(3), "neg": int64(-7), "zero": int64(0), "negzero": int64(0),
		"maxi": int64(math.MaxInt64), "mini": int64(math.MinInt64),
		"intfloat": int64(9007199254740993), "exp": int64(2500), "scaled": int64(1), "bigexp": int64(0),
		"ratio": 0.25, "tenth": 0.1, "pi": 3.141592653589793, "e21": 1e21, "small": 1.5e-300, "denorm": 5e-324,
		"u64": "18446744073709551615", "over": "9223372036854775808", "under": "-9223372036854775809",
		"huge": "1e400", "tiny": "1e-400", "precise": "0.1000000000000000000001", "long": "12345678901234567890.5",
		"manydigits": "3.14159265358979323846", "hugeexp": "1e99999999999999999999",
		"null":     nil,
		"obj":      amqp.Table{"a": int64(1), "b": []any{true, nil, "x", 0.5, "18446744073709551615"}, "c": amqp.Table{}},
		"arr":      []any{int64(1), 2.5, "s", []any{}, amqp.Table{"k": nil}},
		"emptyarr": []any{},
		"deep32":   nested(31, amqp.Table{"leaf": int64(1)}),
	}
	got := m.Publishing.Headers
	for _, k := range []string{"x-outbox-id", "x-partition-key", "x-relay-epoch", "x-created-at"} {
		delete(got, k)
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || !reflect.DeepEqual(g, w) {
			t.Errorf("header %q: got %#v (%T), want %#v (%T)", k, g, g, w, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected header %q", k)
		}
	}
}

func TestFromRecordReplayAndDefaultExchange(t *testing.T) {
	rec := baseRecord()
	rec.Exchange = ""
	m, err := publish.FromRecord(rec, "default-ex", 3, true)
	if err != nil {
		t.Fatal(err)
	}
	if m.Exchange != "default-ex" {
		t.Errorf("exchange %q, want the default", m.Exchange)
	}
	if m.Publishing.Headers["x-replay"] != true {
		t.Errorf("x-replay = %v, want true", m.Publishing.Headers["x-replay"])
	}
	if len(m.Publishing.Headers) != 5 {
		t.Errorf("headers %v, want only the five relay headers", m.Publishing.Headers)
	}
}

func TestFromRecordNoHeaders(t *testing.T) {
	for _, h := range []string{"", "  ", "null", " null\n", "{}"} {
		rec := baseRecord()
		if h != "" {
			rec.Headers = []byte(h)
		}
		m, err := publish.FromRecord(rec, "", 1, false)
		if err != nil {
			t.Errorf("headers %q: %v", h, err)
			continue
		}
		if len(m.Publishing.Headers) != 4 {
			t.Errorf("headers %q: got %v, want the four relay headers", h, m.Publishing.Headers)
		}
	}
}

func TestFromRecordBadHeaders(t *testing.T) {
	for _, tc := range []struct{ headers, reason string }{
		{`[1,2]`, "not a JSON object"},
		{`"text"`, "not a JSON object"},
		{`42`, "not a JSON object"},
		{`{"a":`, "not valid JSON"},
		{`{"a":1} {"b":2}`, "data after"},
		{`{"` + strings.Repeat("k", 256) + `":1}`, "header name"},
		{`{"a":{"` + strings.Repeat("k", 256) + `":1}}`, "header name"},
		// amqp091-go consumers refuse tables nested deeper than 32 levels
		// (and close the connection): such a message must not go out.
		{`{"a":` + strings.Repeat(`{"d":`, 33) + `1` + strings.Repeat(`}`, 33) + `}`, `header "a": nested deeper than 32 levels`},
		{`{"a":` + strings.Repeat(`[`, 33) + strings.Repeat(`]`, 33) + `}`, `header "a": nested deeper than 32 levels`},
	} {
		rec := baseRecord()
		rec.Headers = []byte(tc.headers)
		_, err := publish.FromRecord(rec, "", 1, false)
		var bad *publish.BadRecordError
		if !errors.As(err, &bad) {
			t.Errorf("headers %.40s: error %v, want *BadRecordError", tc.headers, err)
			continue
		}
		if !strings.Contains(bad.Reason, tc.reason) {
			t.Errorf("headers %.40s: reason %q, want it to mention %q", tc.headers, bad.Reason, tc.reason)
		}
	}
}

func TestFromRecordLongShortStrings(t *testing.T) {
	// VARCHAR(255) holds 255 characters, up to 1020 bytes in utf8mb4; AMQP
	// short strings hold 255 bytes.
	rec := baseRecord()
	rec.RoutingKey = strings.Repeat("é", 200)
	var bad *publish.BadRecordError
	if _, err := publish.FromRecord(rec, "", 1, false); !errors.As(err, &bad) || !strings.Contains(bad.Reason, "routing key") {
		t.Errorf("400-byte routing key: %v, want *BadRecordError about the routing key", err)
	}
	rec = baseRecord()
	rec.ID = math.MaxUint64
	if _, err := publish.FromRecord(rec, "", 1, false); !errors.As(err, &bad) {
		t.Errorf("id over int64: %v, want *BadRecordError", err)
	}
}

func TestConfigValidate(t *testing.T) {
	c := publish.Config{URL: "amqp://u:hunter2@host:5672/v"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.ConfirmWindow != 256 || c.MaxAttempts != 5 || c.ReconnectMin != 100*time.Millisecond ||
		c.ReconnectMax != 10*time.Second || c.Logger == nil {
		t.Errorf("defaults not applied: %+v", c)
	}
	for _, bad := range []publish.Config{
		{},
		{URL: "http://u:hunter2@host/"},
		{URL: "amqp://u:hunt er2@host/"},
		{URL: "amqp://u:hunter2@host:99999999/"},
		{URL: "amqp://u:hunter2@host/", ConfirmWindow: -1},
		{URL: "amqp://u:hunter2@host/", MaxAttempts: -1},
		{URL: "amqp://u:hunter2@host/", ReconnectMin: time.Second, ReconnectMax: time.Millisecond},
	} {
		err := bad.Validate()
		if err == nil {
			t.Errorf("%+v: no error", bad)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error shows the password: %v", err)
		}
	}
}
