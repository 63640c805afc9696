package outbox

import (
	"context"
	"database/sql"
	"time"
)

// Message is one message a producer wants published. Only RoutingKey is
// required.
type Message struct {
	// PartitionKey groups messages that must be published in the order they
	// were enqueued, typically an aggregate id. "" means no ordering
	// constraint. At most 255 bytes.
	PartitionKey string
	// Exchange is the target exchange; "" means the relay's
	// --default-exchange. At most 255 bytes.
	Exchange string
	// RoutingKey is the AMQP routing key. Required; at most 255 bytes.
	RoutingKey string
	// MessageType is the semantic name, e.g. "order.placed"; it becomes the
	// AMQP type property. At most 255 bytes.
	MessageType string
	// Headers become AMQP headers. A flat map: values must be strings, bools
	// or numbers (any Go int, uint or float kind, or json.Number); names are
	// non-empty, at most 255 bytes, and must not use the names the relay sets
	// (x-outbox-*, x-relay-*, x-partition-key, x-created-at, x-replay).
	// Stored as a JSON object, or NULL when empty. docs/wire.md says which
	// AMQP type each value gets (a uint64 above math.MaxInt64, for one, goes
	// as its decimal text).
	Headers map[string]any
	// Payload is the message body, stored and published byte for byte.
	Payload []byte
	// ContentType is the AMQP content-type; "" means DefaultContentType
	// ("application/json"). At most 100 bytes.
	ContentType string
	// AvailableAt delays publication until that time. The zero value (stored
	// as NULL) means at once. Stored in UTC with microsecond precision.
	AvailableAt time.Time
}

// Execer runs a statement. *sql.Tx, *sql.DB and *sql.Conn satisfy it. Pass
// the *sql.Tx of your business transaction: the messages then commit or roll
// back with it, which is the point of an outbox.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// DefaultTable is the outbox table's name unless configured otherwise
// (the relay's --table).
const DefaultTable = "outbox"

// Columns returns the outbox table's columns in canonical order, for readers
// that select whole rows. Each call returns a new slice.
func Columns() []string {
	return []string{
		"id", "message_id", "partition_key", "exchange", "routing_key", "message_type",
		"headers", "payload", "content_type", "created_at", "available_at",
		"delivered_at", "attempts", "last_error",
	}
}

// insertColumns are the columns Enqueue writes; the rest take their defaults.
// created_at is written explicitly as UTC_TIMESTAMP(6) so that it is UTC
// whatever the session's time_zone is.
const insertColumns = "(message_id, partition_key, exchange, routing_key, message_type, headers, payload, content_type, available_at, created_at)"

// rowPlaceholders matches insertColumns: eight values, then created_at.
const (
	rowPlaceholders = "(?,?,?,?,?,?,?,?,?,UTC_TIMESTAMP(6))"
	argsPerRow      = 9
)
