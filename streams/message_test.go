package streams

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/publish"
)

// The stream message carries every property and header of the AMQP
// message, the exchange and routing key as application properties, and the
// publishing id; nested header values travel as JSON text.
func TestEncode(t *testing.T) {
	at := time.Date(2026, 11, 27, 10, 0, 0, 123456000, time.UTC)
	m := publish.Message{Exchange: "ex", RoutingKey: "rk", Key: "k", Publishing: amqp.Publishing{
		MessageId: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", Type: "order.placed", ContentType: "application/json",
		Timestamp: at, Body: []byte("\x00{}\x00"),
		Headers: amqp.Table{"traceparent": "00-abc-def-01", "n": int64(7), "f": 1.5, "b": true, "nil": nil,
			"obj": amqp.Table{"a": int64(1)}, publish.HeaderOutboxID: int64(42), publish.HeaderPartitionKey: "k",
			publish.HeaderRelayEpoch: int64(3)},
	}}
	s := Encode(m, 99)
	if !s.HasPublishingId() || s.GetPublishingId() != 99 {
		t.Errorf("publishing id %d (set %v), want 99", s.GetPublishingId(), s.HasPublishingId())
	}
	p := s.Properties
	if p.MessageID != m.Publishing.MessageId || p.Subject != "order.placed" || p.ContentType != "application/json" ||
		!p.CreationTime.Equal(at.Truncate(time.Millisecond)) {
		t.Errorf("properties %+v", p)
	}
	want := map[string]any{"traceparent": "00-abc-def-01", "n": int64(7), "f": 1.5, "b": true, "nil": nil,
		"obj": `{"a":1}`, "x-outbox-id": int64(42), "x-partition-key": "k", "x-relay-epoch": int64(3),
		PropExchange: "ex", PropRoutingKey: "rk"}
	if len(s.ApplicationProperties) != len(want) {
		t.Errorf("application properties %v, want %v", s.ApplicationProperties, want)
	}
	for k, v := range want {
		if got, ok := s.ApplicationProperties[k]; !ok || got != v {
			t.Errorf("application property %q = %#v, want %#v", k, got, v)
		}
	}
	if d := s.GetData(); len(d) != 1 || string(d[0]) != "\x00{}\x00" {
		t.Errorf("body %q", d)
	}
	if _, err := s.MarshalBinary(); err != nil {
		t.Errorf("marshal: %v", err)
	}
}

func TestFromAMQP(t *testing.T) {
	for in, want := range map[string]string{
		"amqp://u:p@h:5672/v":                   "rabbitmq-stream://u:p@h:5552/v",
		"amqp://guest:guest@127.0.0.1:5672/":    "rabbitmq-stream://guest:guest@127.0.0.1:5552/",
		"amqp://u:p@h1:5672/v, amqp://u:p@h2/v": "rabbitmq-stream://u:p@h1:5552/v,rabbitmq-stream://u:p@h2:5552/v",
		"amqps://u:p@h:5671/v":                  "rabbitmq-stream+tls://u:p@h:5551/v",
		"amqp://h":                              "rabbitmq-stream://h:5552/",
	} {
		if got, err := FromAMQP(in); err != nil || got != want {
			t.Errorf("FromAMQP(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := FromAMQP("::"); err == nil {
		t.Error("a URL that does not parse was accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Stream: "orders", Partitions: 4, URL: "rabbitmq-stream://h:5552/", Producer: "default", Window: 10}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]Config{
		"no partitions":   {Stream: "orders", URL: ok.URL, Producer: "d", Window: 1},
		"too many":        {Stream: "orders", Partitions: MaxPartitions + 1, URL: ok.URL, Producer: "d", Window: 1},
		"amqp url":        {Stream: "orders", Partitions: 1, URL: "amqp://h/", Producer: "d", Window: 1},
		"partitions only": {Partitions: 3},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if got := ok.PartitionName(3) + " " + ok.ProducerName(3); got != "orders-3 default-3" {
		t.Errorf("names %q", got)
	}
}
