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
	rec.Headers = []byte(`{"tenant":"acme","n":3,"neg":-7,"big":9007199254740993,"exp":1e3,"two":2.0,"ratio":0.25,"ok":true,"no":false,"x-replay":true,"x-outbox-id":"spoofed"}`)
	m, err := publish.FromRecord(rec, "default-ex", 9, false)
	if err != nil {
		t.Fatal(err)
	}
	want := publish.Message{
		Exchange:   "orders",
		RoutingKey: "order.placed",
		Publishing: amqp.Publishing{
			Headers: amqp.Table{
				"tenant": "acme", "n": int64(3), "neg": int64(-7), "big": int64(9007199254740993),
				"exp": int64(1000), "two": int64(2), "ratio": 0.25, "ok": true, "no": false,
				"x-outbox-id": int64(42), "x-partition-key": "order-7", "x-relay-epoch": int64(9),
			},
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
			Timestamp:    rec.CreatedAt,
			Type:         "order.placed",
			Body:         rec.Payload,
		},
		Size: rec.Size(),
	}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("FromRecord:\ngot  %#v\nwant %#v", m, want)
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
	if len(m.Publishing.Headers) != 4 {
		t.Errorf("headers %v, want only the four relay headers", m.Publishing.Headers)
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
		if len(m.Publishing.Headers) != 3 {
			t.Errorf("headers %q: got %v, want the three relay headers", h, m.Publishing.Headers)
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
		{`{"a":{"b":1}}`, `"a" is an object`},
		{`{"a":[1]}`, `"a" is an array`},
		{`{"a":null}`, `"a" is null`},
		{`{"` + strings.Repeat("k", 256) + `":1}`, "header name"},
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
