package streams

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"

	"github.com/outbox-relay/outbox-relay/publish"
)

// Application properties the stream message carries besides the row's
// headers and the relay's x- headers (publish.HeaderOutboxID, …): the row's
// exchange and routing key, which do not route here.
const (
	PropExchange   = "x-exchange"
	PropRoutingKey = "x-routing-key"
)

// Encode maps an AMQP message as publish.FromRecord builds it to the stream
// message: properties message-id (the UUID text), content-type,
// creation-time (created_at) and subject (message_type, the AMQP type);
// application properties: every header (the row's, traceparent and
// tracestate among them, and the relay's x- headers) plus x-exchange and
// x-routing-key; the body byte for byte. id is the publishing id.
//
// AMQP 1.0 application properties are simple values: strings, booleans,
// integers, doubles and null pass as they are; a nested object or array (a
// header whose JSON value was one) travels as its JSON text.
func Encode(m publish.Message, id uint64) *amqp.AMQP10 {
	p := m.Publishing
	msg := amqp.NewMessage(p.Body)
	msg.Properties = &amqp.MessageProperties{
		MessageID:   p.MessageId,
		ContentType: p.ContentType,
		Subject:     p.Type,
	}
	if !p.Timestamp.IsZero() {
		msg.Properties.CreationTime = p.Timestamp.UTC().Truncate(time.Millisecond)
	}
	props := make(map[string]any, len(p.Headers)+2)
	for k, v := range p.Headers {
		props[k] = simple(v)
	}
	props[PropExchange] = m.Exchange
	props[PropRoutingKey] = m.RoutingKey
	msg.ApplicationProperties = props
	msg.SetPublishingId(int64(id))
	return msg
}

// simple is v as an AMQP 1.0 simple value: itself, or its JSON text.
func simple(v any) any {
	switch v.(type) {
	case nil, string, bool, int64, int32, int16, int8, int, float64, float32:
		return v
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
