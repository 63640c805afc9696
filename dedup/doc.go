// Package dedup is the consuming side of outbox-relay: the inbox, which
// turns the relay's at-least-once delivery into exactly-once effects.
//
// The relay may deliver a message more than once (after a crash, a database
// kill, a broker cut). [Inbox.Process] runs a handler's database work and
// the record "consumer C processed message M" (table message_deduplication,
// primary key (consumer, message_id)) in one transaction: both commit or
// neither does, and a later delivery of M to C finds the record and skips the
// handler. [Consumer] wraps an amqp091 channel around an Inbox: manual acks
// after the commit, prefetch, a handler per message type, a bounded number
// of attempts counted in the database, after which the message goes to
// outbox_failed with source 'inbox', and a clean stop.
//
// [StreamConsumer] reads the relay's stream destination (partition streams
// NAME-0 … NAME-(N-1)) and stores, in the handler's transaction, the offset
// past each message per (consumer, partition stream) in table
// stream_consumer_offsets: a restart resumes after the last committed
// message, each message's effect commits once, without a row per message.
// One process per partition at a time (a GET_LOCK per partition, checked,
// and an epoch fencing the offset write); several processes share the
// partitions and take over a dead one's.
//
// # Isolation level
//
// Any isolation level InnoDB offers keeps the once-only guarantee; READ
// COMMITTED and REPEATABLE READ (the default) are tested. The guarantee does
// not rest on what a transaction reads but on the primary key: Process
// inserts the record before it runs the handler, and InnoDB's duplicate-key
// check locks the key at every level. A second delivery processed at the
// same moment waits on the first's lock; when the first commits, the second
// gets a duplicate-key error (Process returns done == false without running
// its handler); when the first rolls back, the second proceeds. Process
// never checks with a plain SELECT first, which under REPEATABLE READ would
// read a snapshot that does not see a concurrent commit. The level does
// decide what the handler's own reads see: choose it for the handler with
// [Inbox.WithIsolation]. Note that the waiting holds a connection: a
// handler that runs long keeps the duplicates of its message waiting, up to
// innodb_lock_wait_timeout.
//
// The record holds the message id (the AMQP message-id, a UUID; any other
// id is refused), its type and processed_at in UTC. `outbox-relay migrate`
// creates the tables. docs/inbox.md has the whole story: guarantees,
// redelivery policy, unknown message types, failed messages.
//
// # Tracing
//
// [Consumer] runs each handler in an OpenTelemetry consumer span whose
// parent (and link) is the producer's span, read from the W3C headers
// (traceparent, tracestate, baggage) that outbox.Enqueue wrote; a delivery
// without them, or with a malformed traceparent, starts a new trace.
// Spans come from Consumer.TracerProvider or the global provider.
//
// This package imports nothing from the relay; applications can depend on it
// alone.
package dedup
