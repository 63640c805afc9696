// Command quickstart is the consuming side of docs/quickstart.md: it
// declares a durable topic exchange and a durable queue bound to it with
// routing key "#" (every message), then prints each message that arrives
// (message-id, routing key, type and body) and acknowledges it. It stops
// after -count messages, or on Ctrl-C. Run it before the relay's first
// message: the relay declares no exchange, and a message to a missing one
// goes to outbox_failed.
package main
