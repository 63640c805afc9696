// Package checkpoint owns the relay's row in outbox_relay_progress: the stored
// position, leadership (a GET_LOCK held on a dedicated connection, an epoch
// bumped by every new leader, a heartbeat), and the acknowledgement — the one
// database transaction that removes (or marks) delivered rows, records failed
// ones in outbox_failed and moves the position, fenced by the leader's epoch so
// a deposed leader can never move it.
package checkpoint
