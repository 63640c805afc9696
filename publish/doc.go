// Package publish is the relay's AMQP publisher: publisher confirms, mandatory
// returns, reconnects and broker flow control, on top of amqp091-go.
//
// A Publisher owns one AMQP connection and redials it with jittered
// exponential backoff. Config.URL may list a cluster's nodes, separated by
// commas (SplitURLs): the Publisher connects to the first that answers and,
// after a lost connection, dials the following ones in turn; Node names
// the node in use (host:port). A Channel (one per ordering lane) owns one AMQP
// channel in confirm mode on that connection. The model is the one of a
// CockroachDB changefeed sink: Publish emits asynchronously, every message
// later gets exactly one Result through a callback, and Flush returns once
// everything published so far has its Result.
//
// # Guarantees of a Channel
//
//   - Every message for which Publish returned nil gets exactly one Result,
//     unless the Channel (or its Publisher) is closed first. Messages are
//     retained until their Result is delivered; MaxHeldBytes bounds what is
//     retained, and the window (ConfirmWindow) how many are on the wire.
//   - Results are delivered one at a time, from one goroutine owned by the
//     Channel, in publish order per key: a message's Result comes after the
//     Results of every earlier message with its non-empty Message.Key, also
//     while an earlier one is being retried after a nack. Otherwise a Result
//     is delivered as soon as the message has its outcome: Results of
//     different keys, and of messages with Key "", come in the order of
//     their outcomes, not in publish order, so a message that the broker
//     keeps nacking holds back its own key only (see "Nacks"). A caller
//     that needs to know when a set of messages all have their Results
//     counts them, or calls Flush.
//   - Messages with the same non-empty Message.Key reach a queue in publish
//     order: the first delivery of each comes after the first delivery of
//     every earlier message of its key that was routed there, also through
//     nacks, returns, channel exceptions and reconnects (see "Order per key").
//     Messages of different keys, and messages with Key "", carry no order
//     between them.
//   - After a connection loss, or a channel the broker closed, every sent
//     message without a Result is published again, in publish order, before
//     any new one, so a consumer may see a message twice. Nothing is lost.
//     Otherwise only a nacked message is published again; a nack means the
//     broker did not take it, except that a message routed to several queues
//     is nacked when one of them refuses it and the others keep their copy.
//
// # Outcomes
//
//   - Confirmed: the broker acked the message (it is routed and, for a
//     durable queue and a persistent message, stored).
//   - Returned: the broker refused this particular message and will keep
//     refusing it: basic.return of a mandatory publish (no queue bound for the
//     routing key, Code 312), an exchange that does not exist (Code 404,
//     Reason "exchange not found: ...", found before sending or from the
//     channel exception its publish caused), another channel exception
//     the message caused, a message over the connection's size limits
//     (Code 311, never sent), or one over which the broker closed the
//     whole connection MaxAttempts times (the connection.close's code).
//   - Rejected: the broker nacked the message MaxAttempts times in a row,
//     over NackGiveUp at least.
//
// # Order per key
//
// Within a Channel at most one message per non-empty key is on the wire: sent
// and without a Result. A message whose key already has one is accepted (it
// counts in MaxHeldBytes, not in the window, and its Result comes after its
// key's earlier ones) but parked, not sent; messages of other keys pass it
// on the wire, and their Results pass its Result. When the message on the wire gets its Result (confirmed, returned, or
// rejected after MaxAttempts), the next parked message of its key takes its
// window slot and is sent. Messages with Key "" are never parked. The window
// counts messages on the wire only, so a Channel has as many distinct keys on
// the wire as its caller offers, up to the window, however many messages of
// each are parked. A single hot key therefore moves one message per confirm
// round trip; many keys pipeline, up to the window.
//
// Why not pipeline everything and, on a nack, publish the nacked message and
// everything after it again (go-back-N)? Because the broker does not refuse
// a whole stream, it refuses single messages, and a later message of the key
// may already be in the queue. With x-max-length and
// x-overflow=reject-publish, message A of key K is nacked because the queue
// is full; a consumer ack frees room; B of K, published after A, is taken.
// Republishing A and B puts A behind the first copy of B, and the consumer's
// first delivery of B precedes A. Only not sending B until A's fate is known
// keeps the order, and then a nacked A is published again while it is still
// the only message of K in flight. The same holds when a channel exception
// or a lost connection takes the channel down: the sent messages without a
// Result are published again in publish order, and the parked ones follow as
// their keys free up.
//
// # Exchanges that do not exist
//
// Publishing to an exchange that does not exist makes RabbitMQ close the
// channel (404 NOT_FOUND) without naming the publish that caused it; it has
// routed the messages published before it and discards those after it, and
// the publisher cannot tell which were which without their confirms, so
// publishing them again after the close would duplicate some. Bad input must
// cost its neighbours nothing, so the message is not sent at all: the
// Publisher keeps the exchanges known to exist, and before a Channel accepts a
// message to an exchange not known yet, the Publisher asks the broker with a
// passive exchange.declare on a side channel of its connection (one check at
// a time; the 404 closes the side channel, which is reopened for the next).
// An exchange that exists is remembered for the Publisher's life; a message
// to one that does not is resolved Returned (Code 404, Reason "exchange not
// found: 404 NOT_FOUND - no exchange ...") without being sent, its Result
// after those of the earlier messages of its key. Missing exchanges are not remembered: every message to one costs a
// check. The default exchange "" always exists and is never checked.
//
// # Finding the message that closed the channel
//
// An exchange deleted after its check, and other soft errors a publish can
// cause, still close the channel. When exactly one message was unconfirmed,
// it is the cause. Otherwise the Channel reopens and republishes the messages
// that were unconfirmed one at a time, each waiting for its confirm (probe
// mode), until one of them closes the channel again: that one is the cause
// and is reported Returned; the rest resume in pipelined mode. This costs
// one round trip per message ahead of the culprit, only after a channel
// exception, and it needs no parsing of broker error texts. A 404 close also
// drops the exchanges of the unconfirmed messages from the known ones, so
// the next message to each is checked again. Only soft errors a publish can
// cause (311, 403, 404, 406) are blamed on a message; any other channel close
// is retried.
//
// # Messages the broker cannot take
//
// AMQP carries a message's properties and headers in one content-header
// frame, which cannot be split, and the connection's negotiated frame_max
// (RabbitMQ: 131072 by default) bounds every frame, its 8 bytes of
// overhead included. RabbitMQ closes the whole connection over a larger
// one (501 FRAME_ERROR; it tolerates up to 8 bytes more, but amqp091-go
// consumers, among others, close their own connection over any frame past
// frame_max, so the spec's bound is the one kept). A body over the
// broker's max_message_size (128 MiB by default, not told to clients: see
// Config.MaxMessageSize) closes the channel (406 PRECONDITION_FAILED).
// So before a Channel sends a message it checks both on the connection it
// would go on: HeaderFrameSize (exact) against frame_max, the body against
// MaxMessageSize. A message over either is not sent; it is resolved
// Returned, Code 311, with a Reason that names the limit and the size.
//
// # Messages that close the connection
//
// Whatever the check missed (another node's smaller frame_max, a broker
// fault a message triggers) can still make the broker close the whole
// connection with a code a message's own frames can cause (blameConnCode:
// 501 frame, 502 syntax and 505 unexpected-frame errors; never an internal
// error, which any crashed channel process causes, nor a forced close).
// The Publisher then
// does not hand the next connection to its Channels at once: it first
// publishes the messages that were on the wire, over all its Channels, one
// at a time on a side channel, each waiting for its confirm. Confirmed and
// returned ones are resolved so; a nacked one goes back to its Channel. A
// message alone on the wire when the broker closes the connection is the
// cause: after MaxAttempts such closures, the first of them NackGiveUp
// ago at least, it is resolved Returned with the close's code and a Reason that says so, and it is named in the log once,
// with the count. Between those connections the dial backoff keeps
// growing (it starts again from ReconnectMin only after a connection lost
// for another reason), so the Publisher never redials faster than the
// backoff. A message confirmed before the close whose confirm was lost is
// delivered twice, as after any lost connection.
//
// # Nacks
//
// A nacked message is published again on the same channel, still the only
// one of its key on the wire: at once after its first nack, then after a
// backoff (ReconnectMin doubling to ReconnectMax). Meanwhile it holds back
// its own key, whose later messages stay parked, and one window slot; the
// messages of other keys go on the wire, and their Results are delivered
// (and their bytes freed from MaxHeldBytes) as their confirms come. So a
// queue with x-overflow=reject-publish that stays full stops only the keys
// routed to it, each at its head, until the broker takes the head or it is
// Rejected; a Channel whose parked messages behind such heads fill
// MaxHeldBytes waits in Publish. It is reported Rejected
// once it has been nacked MaxAttempts times and NackGiveUp has passed since
// its first nack: a quorum queue nacks every publish while it elects a
// leader (about 3 s when the leader's node dies, measured on a three-node
// cluster), and that must not cost a message. A broker that does not answer
// at all (a quorum queue without a majority) costs nothing either: the
// message waits, unconfirmed, and ConfirmWait says for how long. Its disposition is read from amqp091's DeferredConfirmation, not
// from the NotifyPublish stream: that stream reports a nack as an ack when
// the broker's nack came before an ack with multiple=true covering the same
// tag (seen with RabbitMQ 3.10 and x-overflow=reject-publish; amqp091-go
// v1.16.0 confirms.Multiple ignores what it buffered).
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
// # Connecting
//
// Every AMQP connection of the program is dialled here (Dial, and the
// Publisher's own dials): the URL with ConnOptions, whose TLS files and
// password file are read again at each dial, so a rotated password or
// certificate needs no restart. A client certificate without a password
// logs in with SASL EXTERNAL. Under TLS the batchConn sits below the TLS
// layer: it batches TLS records. A failed dial names the broker (password
// masked), the cause and the fix; IsRefused tells a refusal (login, vhost,
// TLS) from an unreachable broker.
//
// # Timestamps
//
// The AMQP timestamp property has whole seconds: FromRecord sets created_at
// and the broker delivers it truncated to the second. The x-created-at
// header carries the full instant (CreatedAtLayout, microseconds, UTC).
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
//
// # Tracing
//
// With Config.Tracer set, each accepted message gets a span "publish
// <exchange>" (kind producer) from Publish until its Result is delivered,
// or until Close for a message that gets none. Its parent and link is the
// producer's context from the message's traceparent and tracestate
// headers, which are sent unchanged. Without a Tracer no span is made.
package publish
