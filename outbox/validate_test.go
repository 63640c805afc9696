package outbox

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestEncodeHeaders(t *testing.T) {
	type priority int
	got, err := encodeHeaders(0, map[string]any{
		"s": "a<b>&\"c\"", "b": true, "i": -3, "i8": int8(-8), "u64": uint64(math.MaxUint64),
		"f32": float32(0.1), "f64": 2.5, "n": json.Number("1e3"), "named": priority(4), "ü": "注文",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"b":true,"f32":0.1,"f64":2.5,"i":-3,"i8":-8,"n":1e3,"named":4,"s":"a<b>&\"c\"","u64":18446744073709551615,"ü":"注文"}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if !json.Valid([]byte(got)) {
		t.Fatal("not valid JSON")
	}
}

func TestValidationErrors(t *testing.T) {
	long := strings.Repeat("x", 256)
	ok := func() Message { return Message{RoutingKey: "rk"} }
	with := func(f func(*Message)) Message { m := ok(); f(&m); return m }
	hdr := func(k string, v any) Message { return with(func(m *Message) { m.Headers = map[string]any{k: v} }) }
	cases := []struct {
		name     string
		msg      Message
		sentinel error
		field    string
	}{
		{"empty routing key", Message{}, ErrEmptyRoutingKey, "RoutingKey"},
		{"long routing key", with(func(m *Message) { m.RoutingKey = long }), ErrTooLong, "RoutingKey"},
		{"long exchange", with(func(m *Message) { m.Exchange = long }), ErrTooLong, "Exchange"},
		{"long partition key", with(func(m *Message) { m.PartitionKey = long }), ErrTooLong, "PartitionKey"},
		{"long message type", with(func(m *Message) { m.MessageType = long }), ErrTooLong, "MessageType"},
		{"long content type", with(func(m *Message) { m.ContentType = strings.Repeat("c", 101) }), ErrTooLong, "ContentType"},
		{"bad utf8 partition key", with(func(m *Message) { m.PartitionKey = "a\xffb" }), ErrInvalidUTF8, "PartitionKey"},
		{"bad utf8 routing key", with(func(m *Message) { m.RoutingKey = "\xc3" }), ErrInvalidUTF8, "RoutingKey"},
		{"available at year 0", with(func(m *Message) { m.AvailableAt = time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC) }), ErrBadAvailableAt, "AvailableAt"},
		{"nested map header", hdr("a", map[string]any{"b": 1}), ErrBadHeaders, `Headers["a"]`},
		{"slice header", hdr("a", []any{1}), ErrBadHeaders, `Headers["a"]`},
		{"bytes header", hdr("a", []byte("x")), ErrBadHeaders, `Headers["a"]`},
		{"nil header", hdr("a", nil), ErrBadHeaders, `Headers["a"]`},
		{"time header", hdr("a", time.Now()), ErrBadHeaders, `Headers["a"]`},
		{"struct header", hdr("a", struct{}{}), ErrBadHeaders, `Headers["a"]`},
		{"pointer header", hdr("a", new(int)), ErrBadHeaders, `Headers["a"]`},
		{"NaN header", hdr("a", math.NaN()), ErrBadHeaders, `Headers["a"]`},
		{"Inf header", hdr("a", math.Inf(1)), ErrBadHeaders, `Headers["a"]`},
		{"bad json.Number", hdr("a", json.Number("12abc")), ErrBadHeaders, `Headers["a"]`},
		{"empty json.Number", hdr("a", json.Number("")), ErrBadHeaders, `Headers["a"]`},
		{"empty header name", hdr("", "v"), ErrBadHeaders, `Headers[""]`},
		{"long header name", hdr(long, "v"), ErrTooLong, `Headers["` + long + `"]`},
		{"bad utf8 header name", hdr("a\xff", "v"), ErrInvalidUTF8, `Headers["a\xff"]`},
		{"bad utf8 header value", hdr("a", "\xff"), ErrInvalidUTF8, `Headers["a"]`},
		{"x-outbox-id", hdr("x-outbox-id", 1), ErrReservedHeader, `Headers["x-outbox-id"]`},
		{"X-Relay-Epoch", hdr("X-Relay-Epoch", 1), ErrReservedHeader, `Headers["X-Relay-Epoch"]`},
		{"x-partition-key", hdr("x-partition-key", "p"), ErrReservedHeader, `Headers["x-partition-key"]`},
		{"x-replay", hdr("x-replay", true), ErrReservedHeader, `Headers["x-replay"]`},
		{"X-Created-At", hdr("X-Created-At", "2026-11-23T13:45:01.123456Z"), ErrReservedHeader, `Headers["X-Created-At"]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := prepare(3, &c.msg)
			if !errors.Is(err, c.sentinel) {
				t.Fatalf("err = %v, want %v", err, c.sentinel)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("err %T is not a *ValidationError", err)
			}
			if ve.Index != 3 || ve.Field != c.field {
				t.Fatalf("Index, Field = %d, %q; want 3, %q", ve.Index, ve.Field, c.field)
			}
			if strings.HasPrefix(c.field, "Headers") != errors.Is(err, ErrBadHeaders) {
				t.Fatalf("errors.Is(err, ErrBadHeaders) = %v for field %s", errors.Is(err, ErrBadHeaders), c.field)
			}
		})
	}
}

func TestPrepareDefaults(t *testing.T) {
	at := time.Date(2030, 5, 6, 7, 8, 9, 123456789, time.FixedZone("X", 2*3600))
	p, err := prepare(0, &Message{RoutingKey: "rk", AvailableAt: at})
	if err != nil {
		t.Fatal(err)
	}
	if p.contentType != DefaultContentType || p.headers != nil {
		t.Fatalf("contentType %q headers %v", p.contentType, p.headers)
	}
	if p.availableAt != "2030-05-06 05:08:09.123456" {
		t.Fatalf("availableAt = %v, want UTC with microseconds", p.availableAt)
	}
	// Exactly 255 bytes is allowed.
	if _, err := prepare(0, &Message{RoutingKey: strings.Repeat("é", 127) + "x"}); err != nil {
		t.Fatal(err)
	}
}

func TestQuoteTable(t *testing.T) {
	for _, ok := range []string{"outbox", "Orders_Outbox", "t$1", "1a", strings.Repeat("a", 64)} {
		if q, err := QuoteTable(ok); err != nil || q != "`"+ok+"`" {
			t.Errorf("QuoteTable(%q) = %q, %v", ok, q, err)
		}
	}
	for _, bad := range []string{"", "123", "a-b", "a`b", "db.t", "a b", strings.Repeat("a", 65), "ü"} {
		if _, err := QuoteTable(bad); err == nil {
			t.Errorf("QuoteTable(%q) accepted", bad)
		}
	}
}

func TestColumnsFresh(t *testing.T) {
	c := Columns()
	c[0] = "changed"
	if Columns()[0] != "id" {
		t.Fatal("Columns shares its slice")
	}
}

func TestDatetimeBounds(t *testing.T) {
	if time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC).Unix() != minDatetimeUnix ||
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).Unix() != maxDatetimeUnix {
		t.Fatal("DATETIME bounds are wrong")
	}
	for _, ok := range []time.Time{time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)} {
		if _, err := prepare(0, &Message{RoutingKey: "r", AvailableAt: ok}); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	if _, err := prepare(0, &Message{RoutingKey: "r", AvailableAt: time.Date(999, 12, 31, 23, 59, 59, 0, time.UTC)}); !errors.Is(err, ErrBadAvailableAt) {
		t.Errorf("year 999 accepted: %v", err)
	}
}
