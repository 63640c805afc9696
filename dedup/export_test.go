package dedup

import amqp "github.com/rabbitmq/amqp091-go"

// SetAfterCommit makes c call f after a delivery's transaction committed
// and before its ack: where a crash loses the ack of committed work.
func SetAfterCommit(c *Consumer, f func(amqp.Delivery)) { c.afterCommit = f }

// SetBeforeOffset makes c call f in each message's transaction before the
// fenced offset write: where a process that lost its partition may still be.
func SetBeforeOffset(c *StreamConsumer, f func(StreamMessage)) { c.beforeOffset = f }

// StreamMemberLockName is the lock of member slot k of consumer's
// processes over superStream.
func StreamMemberLockName(consumer, superStream string, k int) string {
	return streamMemberLockName(consumer, superStream, k)
}
