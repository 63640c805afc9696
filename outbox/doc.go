// Package outbox is the producer side of outbox-relay and its message model.
//
// An application writes the messages it wants to publish into the outbox table
// in the same database transaction as its business data, with [Enqueue] (or
// [Writer.Enqueue] for a table not named "outbox"). The relay daemon tails the
// binlog (or polls) and publishes each committed row to RabbitMQ, so a message
// is published if and only if the transaction that wrote it committed.
//
// Every message gets a UUIDv7 [MessageID] generated in this process. Ids are
// strictly increasing in the order Enqueue generates them, across goroutines,
// so they sort by creation time. The id is the message's identity end to end:
// it becomes the AMQP message-id, and consumers deduplicate on it.
//
// Input is validated before any SQL runs; a bad message is reported as a
// [*ValidationError] naming the message index and field, and nothing is
// written. The sentinel errors ([ErrEmptyRoutingKey], [ErrTooLong],
// [ErrInvalidUTF8], [ErrBadHeaders], [ErrReservedHeader], [ErrBadAvailableAt])
// classify it for errors.Is.
//
// [Record] is the read side: one stored row as the relay sees it. [Columns]
// lists the table's columns in their canonical order.
//
// Times: DATETIME columns carry no zone. This package writes created_at and
// available_at in UTC (created_at as UTC_TIMESTAMP(6), independent of the
// session's time_zone), and readers interpret them as UTC.
//
// Tracing: when Enqueue's ctx carries an OpenTelemetry span, its W3C trace
// context (traceparent, tracestate, and baggage when set) goes into every
// message's headers, through the OpenTelemetry propagation API only (no
// SDK); the relay carries them and dedup.Consumer continues the trace.
// [Writer] fields turn it off or change the propagator; docs/wire.md says
// which headers carry the context.
//
// This package imports nothing from the relay; applications can depend on it
// alone.
package outbox
