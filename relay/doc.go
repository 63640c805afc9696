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
package relay
