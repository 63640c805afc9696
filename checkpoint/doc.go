// Package checkpoint owns the relay's row in outbox_relay_progress: the stored
// position, leadership (a GET_LOCK held on a dedicated connection, an epoch
// bumped by every new leader, a heartbeat, and a lease a new leader waits out
// before it publishes unless its predecessor released), and the
// acknowledgement — short
// database transactions that remove (or mark) delivered rows and record failed
// ones in outbox_failed, the last of which moves the position, each fenced by
// the leader's epoch so a deposed leader can never move it.
package checkpoint
