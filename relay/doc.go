// Package relay is the supervisor: it takes leadership of a relay name, checks
// the server, delivers what is already pending, then tails the binlog through
// per-partition lanes to RabbitMQ and acknowledges the low watermark in the
// database. A leader term runs as a sequence of modes (Mode): binlog, or
// poll (the SKIP LOCKED poller) with Config.Mode poll, or in Config.Mode auto
// when the binlog cannot be read (a purged position, a missing grant, the
// server's settings at once; trouble that may pass after
// Config.FallbackAfter); an auto relay probes the binlog every
// Config.BinlogRetryInterval and hands over back to binlog mode through a
// window that publishes only rows still pending. An operator's pause stops
// the mode the way a clean stop does while the relay keeps leadership; a
// resume starts it again from the stored checkpoint. On SIGTERM it stops
// reading at a transaction boundary, waits (at most Config.ShutdownTimeout)
// for in-flight confirms, acknowledges them and lets leadership go.
//
// Binlog mode (runBinlog) reads on the term's goroutine and owns a group of
// named goroutines (lease watch, stop at a boundary, lanes, acker, due-time
// sweep) that one shutdown policy stops in order. Poll mode (runPoll) runs
// the poller's rounds and, in auto mode, probes the binlog; its stop lets
// the rounds under way commit. A stop waits at most Config.ShutdownTimeout
// for the transaction or the rounds under way, and not at all while the
// broker is unreachable; a cut is logged with what will be published
// again. The relay consumes its dependencies through small interfaces
// (seams.go): a sink per lane, the progress store, the leadership lease,
// the binlog server and its source, binlog mode's publisher (its sinks, the
// first start's sweep, the due-time sweep), poll mode's publisher and
// poller, and the publisher's connection, which the unit tests replace with in-memory
// fakes. What Ready reports is one supervisorState.
//
// Before it publishes anything on a server (each leader term, each mode, each
// reconnect of the binlog stream) it checks that the server holds every
// transaction of which it has sent a message (failoverCheck, kept across
// terms and, with Config.StateFile, across restarts); a server that does
// not is a lossy failover, and Run stops with a *LostGTIDsError unless
// Config.AcceptLostGTIDs. Errors a restart does not cure stop Run too, and
// mark the progress row FAILED.
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
