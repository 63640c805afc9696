// Package streams is the relay's stream destination: it publishes outbox
// messages over the RabbitMQ stream protocol (plugin rabbitmq_stream, port
// 5552) into the partition streams NAME-0 … NAME-(N-1), the layout of a
// super stream, with one named producer per partition so that the broker
// deduplicates by publishing id.
//
// The pieces:
//
//   - Partition chooses a row's partition as the super-stream clients do
//     (murmur3, seed 104729, of the partition key, modulo N); rows with the
//     key ” are spread by their message id, which is as free as round
//     robin but the same on every re-publication.
//   - Encode maps a publish.Message (the AMQP message of section "The message
//     on the wire" in docs/wire.md) to an AMQP 1.0 stream message.
//   - Publisher holds the connection (a stream.Environment) and one Producer
//     per partition. A Producer is a sink: Publish sends one message with
//     its publishing id, and every message gets one publish.Result through
//     the callback. A message the broker does not confirm (a connection lost,
//     a timeout) makes the Producer fail: its Err is set, Failed is closed
//     and every later Publish returns it. The caller restarts from its
//     durable checkpoint, re-publishing with the same ids; it must never
//     retry one message alone, because the broker drops an id that is not
//     above the highest it stored, so a retried message behind a stored one
//     would be lost.
//   - LastIDs asks the broker for each producer's last stored publishing id
//     (the stream protocol's query_publisher_sequence). Where the next
//     messages are not the deterministic continuation of stored counters,
//     the caller numbers freshly: above FreshAfter, the highest of the
//     broker's last id, the ids this process issued under the name
//     (Issued) and the relay epoch's base (EpochBase, epoch<<40), so that
//     no older publisher still sending (a frozen leader, an undrained
//     earlier term) shares an id with a new message. StartFresh and Router
//     do that; a Router replaces a failed producer at its next publish.
//   - No broker call runs under the lock ConfirmWait and Close take; each
//     is bounded by the caller's context, and Close waits for them.
//   - Declare is the topology step: it declares the partition streams that
//     do not exist (existing ones are used as they are) and, where the
//     broker and client allow it (3.13+ for the client API), the super
//     stream.
//
// docs/wire.md describes the message, docs/operations.md the flags and the
// guarantee of each case.
package streams
