package validator

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// The validator's property checks accept a delivery that follows
// docs/wire.md and name each departure from it.
func TestCompareFollowsTheWireContract(t *testing.T) {
	created := time.Date(2026, 11, 23, 13, 45, 1, 123456000, time.UTC)
	exp := &Expected{
		ID: outbox.MessageID{1}, PartitionKey: "k", Exchange: "ex", RoutingKey: "rk", MessageType: "t",
		Payload: []byte("body"), CreatedAt: created,
		Headers: map[string]any{
			"i": 3, "u": uint64(math.MaxUint64), "f": 0.1, "two": 2.0, "n": json.Number("1e400"),
			"s": "x", "b": true, "null": nil, "obj": map[string]any{"a": []any{int64(1), nil}},
		},
	}
	good := func() amqp.Delivery {
		return amqp.Delivery{
			Exchange: "ex", RoutingKey: "rk", Type: "t", ContentType: "application/json",
			DeliveryMode: amqp.Persistent, Body: []byte("body"), Timestamp: time.Unix(created.Unix(), 0),
			Headers: amqp.Table{
				"x-outbox-id": int64(1), "x-partition-key": "k", "x-relay-epoch": int64(1),
				"x-created-at": "2026-11-23T13:45:01.123456Z",
				"i":            int64(3), "u": "18446744073709551615", "f": 0.1, "two": int64(2), "n": "1e400",
				"s": "x", "b": true, "null": nil, "obj": amqp.Table{"a": []any{int64(1), nil}},
			},
		}
	}
	if msg := compare(exp, good()); msg != "" {
		t.Fatalf("a delivery per the contract: %s", msg)
	}
	for _, tc := range []struct {
		name, want string
		mod        func(*amqp.Delivery)
	}{
		{"int as double", `header "i"`, func(d *amqp.Delivery) { d.Headers["i"] = 3.0 }},
		{"uint64 as double", `header "u"`, func(d *amqp.Delivery) { d.Headers["u"] = 1.8446744073709552e19 }},
		{"integral float as double", `header "two"`, func(d *amqp.Delivery) { d.Headers["two"] = 2.0 }},
		{"null dropped", `header "null" missing`, func(d *amqp.Delivery) { delete(d.Headers, "null") }},
		{"nested differs", `header "obj"`, func(d *amqp.Delivery) { d.Headers["obj"] = amqp.Table{"a": []any{int64(2), nil}} }},
		{"no x-created-at", "x-created-at is <nil>", func(d *amqp.Delivery) { delete(d.Headers, "x-created-at") }},
		{"x-created-at in local time", "not of the form", func(d *amqp.Delivery) { d.Headers["x-created-at"] = "2026-11-23T18:45:01.123456+05:00" }},
		{"x-created-at off", "want the row's created_at", func(d *amqp.Delivery) { d.Headers["x-created-at"] = "2026-11-23T13:45:01.123457Z" }},
		{"timestamp off", "cut to the second", func(d *amqp.Delivery) { d.Timestamp = d.Timestamp.Add(5 * time.Hour) }},
	} {
		d := good()
		tc.mod(&d)
		if msg := compare(exp, d); !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %q, want it to mention %q", tc.name, msg, tc.want)
		}
	}
}
