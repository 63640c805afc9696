package dedup

import (
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The failed row's headers are the producer's own, as JSON: the headers the
// relay adds are left out (it sets them again on a retry), and AMQP values
// JSON has no form for become text.
func TestHeadersJSON(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.FixedZone("x", 3600))
	got := headersJSON(amqp.Table{
		"x-outbox-id": int64(7), "x-partition-key": "k", "x-relay-epoch": int64(3), "x-replay": true,
		"x-created-at": "2026-01-02T02:04:05.000006Z", "X-Outbox-Other": "dropped",
		"tenant": "acme", "n": int64(-3), "small": int8(4), "ok": false, "ratio": 0.25, "nan": math.NaN(),
		"at": at, "bytes": []byte("text"), "raw": []byte{0xff, 0x00}, "price": amqp.Decimal{Scale: 2, Value: -1999},
		"nested": amqp.Table{"a": []any{int32(1), "b", nil}}, "bad": "x\xffy",
	})
	want := `{"at":"2026-01-02T02:04:05.000006Z","bad":"x` + "\uFFFD" + `y","bytes":"text","n":-3,"nan":"NaN",` +
		`"nested":{"a":[1,"b",null]},"ok":false,"price":"-19.99","ratio":0.25,"raw":"/wA=","small":4,"tenant":"acme"}`
	if got != want {
		t.Fatalf("headersJSON\n got %v\nwant %s", got, want)
	}
	if got := headersJSON(amqp.Table{"x-outbox-id": int64(1)}); got != nil {
		t.Fatalf("only relay headers: %v, want nil (NULL)", got)
	}
	if got := headersJSON(nil); got != nil {
		t.Fatalf("no headers: %v, want nil (NULL)", got)
	}
}

func TestDecimalText(t *testing.T) {
	for _, c := range []struct {
		d    amqp.Decimal
		want string
	}{
		{amqp.Decimal{Scale: 0, Value: 12}, "12"},
		{amqp.Decimal{Scale: 2, Value: 1999}, "19.99"},
		{amqp.Decimal{Scale: 3, Value: 5}, "0.005"},
		{amqp.Decimal{Scale: 1, Value: -5}, "-0.5"},
		{amqp.Decimal{Scale: 2, Value: -100}, "-1.00"},
	} {
		if got := decimalText(c.d); got != c.want {
			t.Errorf("decimalText(%+v) = %q, want %q", c.d, got, c.want)
		}
	}
}

func TestTruncate(t *testing.T) {
	if got := truncate("héllo", 3); got != "hél" {
		t.Fatalf("truncate = %q", got)
	}
	if got := truncate("abc", 3); got != "abc" {
		t.Fatalf("truncate = %q", got)
	}
	long := truncate(strings.Repeat("é", 300)+"\xff", 255)
	if !utf8.ValidString(long) || utf8.RuneCountInString(long) != 255 {
		t.Fatalf("truncate to 255: %d characters, valid %v", utf8.RuneCountInString(long), utf8.ValidString(long))
	}
}

// created_at comes from x-created-at (microseconds), else the AMQP
// timestamp, else now; always UTC and a DATETIME.
func TestCreatedAt(t *testing.T) {
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	ts := time.Date(2026, 1, 1, 0, 0, 1, 0, time.FixedZone("x", -7200))
	for _, c := range []struct {
		name string
		d    amqp.Delivery
		want time.Time
	}{
		{"header", amqp.Delivery{Timestamp: ts, Headers: amqp.Table{"x-created-at": "2026-01-01T02:00:01.123456Z"}},
			time.Date(2026, 1, 1, 2, 0, 1, 123456000, time.UTC)},
		{"timestamp", amqp.Delivery{Timestamp: ts, Headers: amqp.Table{"x-created-at": "garbage"}}, ts.UTC()},
		{"none", amqp.Delivery{}, now},
		{"out of range", amqp.Delivery{Timestamp: time.Unix(1<<40, 0)}, now},
	} {
		if got := createdAt(c.d, now); !got.Equal(c.want) || got.Location() != time.UTC {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
