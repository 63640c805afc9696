// Command demo is the producer and consumer half of `make demo`.
//
// The producer writes messages into the outbox at a steady rate, each in its
// own transaction with a business write, as an application would; the relay
// publishes them. The consumer takes them from a queue through the inbox
// (package dedup): each message's effect (a row in demo_order_updates)
// commits together with the inbox record, and the ack follows the commit.
// To show what the inbox is for, the demo publishes a copy of every
// -replay-every'th message it received, as a relay that restarts before its
// checkpoint does; the inbox skips the copies. It prints every message with
// its commit → receive latency, stops by itself after -count messages or on
// Ctrl-C, and prints a summary: messages sent, processed, duplicates
// skipped, effects committed.
package main
