package publish

import (
	"fmt"
	"math"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Headers the relay sets on every message (docs/wire.md). A row's own headers
// of these names are dropped, so consumers can trust them.
const (
	HeaderOutboxID     = "x-outbox-id"
	HeaderPartitionKey = "x-partition-key"
	HeaderRelayEpoch   = "x-relay-epoch"
	HeaderReplay       = "x-replay"
	// HeaderCreatedAt is created_at with its microseconds, in
	// CreatedAtLayout; absent when created_at is the zero date.
	HeaderCreatedAt = "x-created-at"
)

// Outcome is what became of a published message.
type Outcome int

const (
	// Confirmed: the broker acked the message.
	Confirmed Outcome = iota + 1
	// Returned: the broker refused this message and would refuse it again
	// (unroutable mandatory publish, missing exchange, ...). Code and Reason
	// say why.
	Returned
	// Rejected: the broker nacked the message MaxAttempts times.
	Rejected
)

func (o Outcome) String() string {
	switch o {
	case Confirmed:
		return "confirmed"
	case Returned:
		return "returned"
	case Rejected:
		return "rejected"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result is the outcome of one message.
type Result struct {
	// Tag is Message.Tag, given back unchanged.
	Tag     any
	Outcome Outcome
	// Code is the AMQP reply code for Returned: 312 NO_ROUTE for a
	// basic.return, the channel exception's code (404 for a missing
	// exchange) otherwise. Zero for Confirmed and Rejected.
	Code int
	// Reason is empty for Confirmed; "312 NO_ROUTE" for a basic.return,
	// "exchange not found: 404 NOT_FOUND - no exchange ..." for a missing
	// exchange, "nacked N times over D" for Rejected.
	Reason string
}

// Message is one message to publish.
type Message struct {
	Exchange, RoutingKey string
	// Publishing holds the properties and body. The Channel always publishes
	// with mandatory set, so unroutable messages come back as Returned.
	Publishing amqp.Publishing
	// Key is the partition key: messages with the same non-empty Key are
	// delivered in publish order, also through nacks and reconnects (at most
	// one of them is on the wire at a time), and their Results come in
	// publish order. '' means no ordering constraint.
	Key string
	// Tag is the caller's handle, given back in Result.
	Tag any
	// Size is the caller's accounting of the message in bytes: what it
	// counts in Config.MaxHeldBytes (optional: 0 counts its body and 160).
	Size int
	// Seq is the publishing id for the stream destination (package
	// streams): strictly increasing per producer, 0 to let the producer
	// number it. The AMQP Channel ignores it.
	Seq uint64
}

// BadRecordError says that a message cannot be published as it is: the
// relay moves its row to outbox_failed with Reason and goes on. FromRecord
// returns it for rows it cannot convert, Channel.Publish for messages that
// cannot be encoded.
type BadRecordError struct {
	Reason string
}

func (e *BadRecordError) Error() string { return "bad outbox record: " + e.Reason }

func badRecord(format string, args ...any) error {
	return &BadRecordError{Reason: fmt.Sprintf(format, args...)}
}

// FromRecord builds the wire message (docs/wire.md) for one outbox row, with
// Tag left nil for the caller to set:
//
//   - exchange rec.Exchange, or defaultExchange when that is empty;
//     routing key rec.RoutingKey; body rec.Payload byte for byte;
//   - Key rec.PartitionKey (the Channel's order per key);
//   - MessageId rec.MessageID.String(), Type message_type, ContentType,
//     DeliveryMode persistent, Timestamp created_at;
//   - headers: the row's JSON object, each value carried exactly
//     (recordHeaders: strings, bools, null as void, numbers as int64, double
//     or their JSON text, objects and arrays as nested tables and arrays),
//     then x-outbox-id (int64), x-partition-key, x-relay-epoch (int64),
//     x-created-at (CreatedAtLayout) and, when replay, x-replay true. The
//     relay's names replace the row's headers of the same names.
//
// SQL NULL headers and the JSON text null (what json.Marshal makes of a nil
// map) mean no row headers. Headers that are not a JSON object, values
// nested deeper than 32 levels, and names or values longer than AMQP allows
// give a *BadRecordError.
func FromRecord(rec *outbox.Record, defaultExchange string, epoch int64, replay bool) (Message, error) {
	if rec.ID > math.MaxInt64 {
		return Message{}, badRecord("id %d does not fit x-outbox-id (int64)", rec.ID)
	}
	headers, err := recordHeaders(rec.Headers)
	if err != nil {
		return Message{}, err
	}
	delete(headers, HeaderReplay)
	delete(headers, HeaderCreatedAt)
	if !rec.CreatedAt.IsZero() {
		headers[HeaderCreatedAt] = FormatCreatedAt(rec.CreatedAt)
	}
	headers[HeaderOutboxID] = int64(rec.ID)
	headers[HeaderPartitionKey] = rec.PartitionKey
	headers[HeaderRelayEpoch] = epoch
	if replay {
		headers[HeaderReplay] = true
	}
	exchange := rec.Exchange
	if exchange == "" {
		exchange = defaultExchange
	}
	m := Message{
		Exchange:   exchange,
		RoutingKey: rec.RoutingKey,
		Key:        rec.PartitionKey,
		Publishing: amqp.Publishing{
			Headers:      headers,
			ContentType:  rec.ContentType,
			DeliveryMode: amqp.Persistent,
			MessageId:    rec.MessageID.String(),
			Timestamp:    rec.CreatedAt,
			Type:         rec.MessageType,
			Body:         rec.Payload,
		},
		Size: rec.Size(),
	}
	// VARCHAR(255) counts characters; AMQP short strings count bytes.
	if err := validateMessage(&m); err != nil {
		return Message{}, err
	}
	return m, nil
}

// validateMessage checks what amqp091 would only find while writing the
// frame: it then tears down the whole connection, and the republish after
// the reconnect would do it again, forever.
func validateMessage(m *Message) error {
	p := &m.Publishing
	for _, f := range [...]struct{ name, v string }{
		{"exchange", m.Exchange}, {"routing key", m.RoutingKey},
		{"content type", p.ContentType}, {"content encoding", p.ContentEncoding},
		{"correlation id", p.CorrelationId}, {"reply-to", p.ReplyTo},
		{"expiration", p.Expiration}, {"message id", p.MessageId},
		{"type", p.Type}, {"user id", p.UserId}, {"app id", p.AppId},
	} {
		if len(f.v) > 255 {
			return badRecord("%s is %d bytes, AMQP allows 255", f.name, len(f.v))
		}
	}
	if err := p.Headers.Validate(); err != nil {
		return badRecord("headers: %v", err)
	}
	return validateTableKeys(p.Headers)
}

func validateTableKeys(t amqp.Table) error {
	for k, v := range t {
		if len(k) > 255 {
			return badRecord("header name %.40q... is %d bytes, AMQP allows 255", k, len(k))
		}
		if err := validateNestedKeys(v); err != nil {
			return err
		}
	}
	return nil
}

func validateNestedKeys(v any) error {
	switch v := v.(type) {
	case amqp.Table:
		return validateTableKeys(v)
	case []any:
		for _, e := range v {
			if err := validateNestedKeys(e); err != nil {
				return err
			}
		}
	}
	return nil
}
