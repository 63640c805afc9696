// Package checkpoint owns the relay's row in outbox_relay_progress as a
// leader writes it: the stored position (Load), the mode and its reason,
// errors, the status a leader marks (FAILED, a pause it has stopped for),
// the RabbitMQ node it publishes to, and the acknowledgement — short
// database transactions that remove (or mark) delivered rows and record
// failed ones in outbox_failed, the last of which moves the position, each
// fenced by the leader's epoch so a deposed leader can never move it
// (ErrFenced).
//
// Taking and keeping the epoch (leadership) is package
// checkpoint/leadership; what operators read and change in the row
// (status, pause, resume, checkpoint set) is package checkpoint/operator.
package checkpoint
