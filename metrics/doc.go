// Package metrics holds the relay's Prometheus metrics and serves its HTTP
// endpoints (docs/operations.md).
//
// # Metrics
//
// All names start with outbox_relay_. They are public interface: dashboards
// and alert rules (deploy/) are written against them.
//
//	outbox_relay_mode{mode="binlog"|"poll"}          gauge  1 for the mode the leader runs in, 0 for the other
//	outbox_relay_leader                               gauge  1 while this instance holds leadership
//	outbox_relay_published_total                      counter messages the broker confirmed
//	outbox_relay_publish_failures_total{reason}       counter messages that ended without a confirm, by reason
//	outbox_relay_delivery_latency_seconds             histogram created_at → broker confirm
//	outbox_relay_lag_seconds                          gauge  how long the oldest row still to be delivered has been due; 0 when none is
//	outbox_relay_pending_rows                         gauge  rows of the outbox table not yet delivered (at most PendingRowsCap)
//	outbox_relay_inflight_messages                    gauge  messages read and not yet answered by the broker
//	outbox_relay_inflight_bytes                       gauge  bytes of the rows read and not yet acknowledged in the database
//	outbox_relay_reconnects_total{target,node}        counter reconnections to mysql, binlog, amqp (node: the broker's host:port)
//	outbox_relay_failed_messages_total                counter rows moved to outbox_failed
//	outbox_relay_binlog_retention_headroom_seconds    gauge  lower bound on the time until the stored position may be purged
//	outbox_relay_paused                               gauge  1 while this instance leads a paused relay and has stopped for it
//	outbox_relay_paused_seconds                       gauge  how long this instance has held the pause; 0 when not paused
//
// Every series means the same in binlog and poll mode. The relay package's
// leader counts the backlog with one bounded statement on the outbox table
// every few seconds while a backlog may exist, also while paused, and sets
// lag_seconds and pending_rows from it (SetLag, SetPendingRows); a standby
// reports 0 for both. The in-flight series are the binlog pipeline's share
// (SetInflight) plus the poll rounds' (AddInflight): a poll round's messages
// count from their publication until the broker answered them all, its bytes
// until its transaction ends.
//
// The reason label takes the values of the Reason constants, the target
// label those of the Target constants, the mode label those of ModeBinlog and
// ModePoll; every series exists (at 0) from the start, so rate() and absent()
// work before the first event.
//
// A *Metrics holds no package-level state: create one per registry with New.
// Every method of a nil *Metrics does nothing, so code paths (and tests) that
// have no metrics may call them unconditionally.
//
// # HTTP
//
// Listen and ServeListener (or Serve, which does both) serve /metrics,
// /healthz and /readyz on --metrics-addr. Listen binds at once so that a bad
// or busy address is an error at start, not a log line later.
//
// # Binlog retention headroom
//
// RetentionHeadroom computes how long the binlog file holding the stored
// position is certain to survive the server's automatic expiry; see its
// documentation for the exact approximation.
package metrics
