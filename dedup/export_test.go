package dedup

import amqp "github.com/rabbitmq/amqp091-go"

// SetAfterCommit makes c call f after a delivery's transaction committed
// and before its ack: where a crash loses the ack of committed work.
func SetAfterCommit(c *Consumer, f func(amqp.Delivery)) { c.afterCommit = f }
