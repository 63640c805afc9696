// Package relay is the supervisor: it takes leadership of a relay name, checks
// the server, delivers what is already pending, then tails the binlog through
// per-partition lanes to RabbitMQ and acknowledges the low watermark in the
// database. On SIGTERM it stops reading, waits for in-flight confirms,
// acknowledges them and lets leadership go.
package relay
