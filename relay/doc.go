// Package relay is the supervisor: it takes leadership of a relay name, checks
// the server, delivers what is already pending, then tails the binlog through
// per-partition lanes to RabbitMQ and acknowledges the low watermark in the
// database. When the binlog cannot be read it polls the table instead (--mode
// auto), and goes back when it can; an operator's pause stops it the way a
// clean stop does while it keeps leadership. On SIGTERM it stops reading,
// waits for in-flight confirms, acknowledges them and lets leadership go.
//
// Before it publishes anything on a server (each leader term, each mode, each
// reconnect of the binlog stream) it checks that the server holds every
// transaction of which it has sent a message (publishedLog); a server that
// does not is a lossy failover, and Run stops with a *LostGTIDsError. Errors a
// restart does not cure stop Run too, and mark the progress row FAILED.
//
// Publishing goes through one publish.Publisher per mode: it dials the nodes
// of Config.AMQPURL in turn, and a lane's confirm window counts messages on
// the wire only (followers parked behind their key count in
// Config.MaxInflightBytes). A goroutine of each leader term records in the
// progress row, on a change only, the broker node it publishes to and since
// when confirms have stopped (status shows both; Ready says the same).
// Standbys wait for the leader's lock; the leader's heartbeat is one
// statement per interval. The relay's own sessions ask for
// binlog_row_image=MINIMAL where the grants allow it, so its acknowledging
// deletes log ids, not payloads.
package relay
