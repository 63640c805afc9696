// Package publish is the relay's AMQP publisher: publisher confirms, mandatory
// returns, reconnects and broker flow control, on top of amqp091-go.
//
// A Publisher owns one AMQP connection and redials it with jittered
// exponential backoff. A Channel (one per ordering lane) owns one AMQP
// channel in confirm mode on that connection. The model is the one of a
// CockroachDB changefeed sink: Publish emits asynchronously, every message
// later gets exactly one Result through a callback, and Flush returns once
// everything published so far has its Result.
//
// # Guarantees of a Channel
//
//   - Every message for which Publish returned nil gets exactly one Result,
//     unless the Channel (or its Publisher) is closed first. Messages are
//     retained until their Result is delivered; the window (ConfirmWindow)
//     bounds how many are retained.
//   - Results are delivered in publish order, one at a time, from one
//     goroutine owned by the Channel. A later message's Result is held back
//     until every earlier message has its Result, also while an earlier one
//     is being retried after a nack.
//   - On the wire a Channel publishes in Publish order. Two things may break
//     that order for a consumer: a nacked message is republished at once on
//     the same channel, behind messages published after it; and after a
//     connection or channel loss every unconfirmed message is republished,
//     in its original order, before any new one, so a consumer may see a
//     message twice (order of first deliveries is kept). Nothing is lost.
//
// # Outcomes
//
//   - Confirmed: the broker acked the message (it is routed and, for a
//     durable queue and a persistent message, stored).
//   - Returned: the broker refused this particular message and will keep
//     refusing it: basic.return of a mandatory publish (no queue bound for the
//     routing key, Code 312), or a channel exception that the message caused,
//     such as a missing exchange (Code 404, Reason "exchange not found: ...").
//   - Rejected: the broker nacked the message MaxAttempts times in a row.
//
// # Finding the message that closed the channel
//
// Publishing to an exchange that does not exist makes RabbitMQ close the
// channel (404 NOT_FOUND) without naming the publish that caused it, and it
// discards every publish that followed on that channel. When exactly one
// message was unconfirmed, it is the cause. Otherwise the Channel reopens and
// republishes its unconfirmed messages one at a time, each waiting for its
// confirm (probe mode), until one of them closes the channel again: that one
// is the cause and is reported Returned; the rest resume in pipelined mode.
// This costs one round trip per message ahead of the culprit, only after a
// channel exception, and it needs no parsing of broker error texts and no
// separate existence checks that could go stale. Only soft errors a publish
// can cause (311, 403, 404, 406) are blamed on a message; any other
// channel close is retried.
//
// # Nacks
//
// A nacked message is published again at once on the same channel, up to
// MaxAttempts publishes, then reported Rejected. Its disposition is read from
// amqp091's DeferredConfirmation, not from the NotifyPublish stream: that
// stream reports a nack as an ack when the broker's nack came before an
// ack with multiple=true covering the same tag (seen with RabbitMQ 3.10 and
// x-overflow=reject-publish; amqp091-go v1.16.0 confirms.Multiple ignores
// what it buffered).
//
// # Writes
//
// amqp091 flushes its buffer after every message: one write system call
// and one TCP segment per publish, which the broker then reads and parses
// on its own. The Publisher's connection queues those writes and one
// goroutine sends what has gathered (batchConn): a lone message goes out at
// once, and under load the frames of many messages, from all lanes, share
// one system call. Confirms, not writes, still decide what counts as sent.
//
// # Timestamps
//
// The AMQP timestamp property has whole seconds: FromRecord sets created_at
// and the broker delivers it truncated to the second.
//
// # Correlating returns
//
// A basic.return carries no delivery tag. RabbitMQ sends it right before the
// basic.ack of the same publish, and amqp091 hands both over from its one
// reader goroutine, so when the Channel's goroutine takes a confirmation it
// first drains the returns that are already queued: a return is always
// recorded before its ack is processed. A return is matched to the
// confirmation by (MessageId, exchange, routing key). Two unconfirmed
// messages on one channel with the same triple would be ambiguous; they go to
// the same route, so both are returned or neither is, except when bindings
// change between the two publishes. A message without a MessageId is matched
// by exchange and routing key alone, which has the same property.
package publish
