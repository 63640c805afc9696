package publish

// This file holds the size limits a message must respect on a connection
// (docs/wire.md, "Size limits"): the content-header frame within the
// negotiated frame_max, the body within the broker's max_message_size.

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	// DefaultMaxMessageSize is RabbitMQ 3.10's default max_message_size:
	// the largest body the broker takes (it closes the channel with 406
	// PRECONDITION_FAILED over a larger one). AMQP 0-9-1 does not tell a
	// client the broker's setting.
	DefaultMaxMessageSize = 128 << 20

	// frameOverhead is what a frame adds to its payload: type (1),
	// channel (2), payload size (4) and the frame-end octet (1).
	// frame_max bounds the whole frame, overhead included.
	frameOverhead = 8

	// headerFixed is the part of a content-header payload that does not
	// depend on the properties: class id (2), weight (2), body size (8) and
	// the property flags (2).
	headerFixed = 2 + 2 + 8 + 2
)

// HeaderFrameSize is the size in bytes of the content-header frame that
// carries p's properties and headers, frame overhead included, exactly as
// amqp091-go writes it. AMQP cannot split this frame, so it must fit in the
// connection's frame_max (RabbitMQ's default 131072), or the broker closes
// the whole connection with 501 FRAME_ERROR. p's headers must be of the
// types amqp.Table.Validate accepts; a value of another type counts 0.
func HeaderFrameSize(p *amqp.Publishing) int {
	n := frameOverhead + headerFixed
	for _, s := range [...]string{
		p.ContentType, p.ContentEncoding, p.CorrelationId, p.ReplyTo, p.Expiration,
		p.MessageId, p.Type, p.UserId, p.AppId,
	} {
		if s != "" {
			n += 1 + len(s) // shortstr: length octet, bytes
		}
	}
	if len(p.Headers) > 0 {
		n += tableSize(p.Headers)
	}
	if p.DeliveryMode > 0 {
		n++
	}
	if p.Priority > 0 {
		n++
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// tableSize is the encoded size of a field table: a 4-byte length, then
// each name as a shortstr and each value with its type octet.
func tableSize(t amqp.Table) int {
	n := 4
	for k, v := range t {
		n += 1 + len(k) + fieldSize(v)
	}
	return n
}

// fieldSize is the encoded size of one field value, type octet included,
// following amqp091-go's writeField.
func fieldSize(v any) int {
	switch v := v.(type) {
	case nil:
		return 1
	case bool, byte, int8:
		return 2
	case int16, uint16:
		return 3
	case int, int32, uint32, float32:
		return 5
	case amqp.Decimal:
		return 6
	case int64, float64, time.Time:
		return 9
	case string:
		return 5 + len(v)
	case []byte:
		return 5 + len(v)
	case []any:
		n := 5
		for _, e := range v {
			n += fieldSize(e)
		}
		return n
	case amqp.Table:
		return 1 + tableSize(v)
	}
	return 0
}

// sizeRefusal says why m cannot be published on conn as it is, "" when it
// can: its content-header frame exceeds conn's negotiated frame_max
// (headerSize is HeaderFrameSize of m), or its body exceeds maxBody (the
// broker's max_message_size as configured).
func sizeRefusal(conn *amqp.Connection, headerSize int, m *Message, maxBody int64) string {
	if frameMax := conn.Config.FrameSize; frameMax > 0 && headerSize > frameMax {
		return fmt.Sprintf("properties and headers take a content-header frame of %d bytes, over the connection's frame_max of %d bytes "+
			"(AMQP cannot split that frame: make the headers smaller, or carry the data in the payload)", headerSize, frameMax)
	}
	if body := int64(len(m.Publishing.Body)); maxBody > 0 && body > maxBody {
		return fmt.Sprintf("payload of %d bytes is over the broker's max_message_size of %d bytes "+
			"(make the payload smaller; a broker whose max_message_size was raised must be named to the relay with --amqp-max-message-size)", body, maxBody)
	}
	return ""
}
