// Package leadership elects one leader among the relay processes of a
// relay name and keeps it honest: a MySQL user lock (GET_LOCK) held on a
// dedicated connection, an epoch in the progress row bumped by every new
// leader (which fences the writes of package checkpoint), a heartbeat, and
// a lease a new leader waits out before it publishes unless its
// predecessor released (Elector.Acquire, Leader). A takeover from a
// predecessor that did not release ends its lock connection and the
// connections of its poll workers (found by their poll locks,
// checkpoint.PollLockName), whose open rounds would otherwise keep partition
// heads locked for as long as it is stopped. It also keeps this
// process's row of outbox_relay_instances (standbys and leaders, for
// `status`), and Wake, which interrupts a leader's wait so it reads an
// operator's pause or resume at once.
package leadership
