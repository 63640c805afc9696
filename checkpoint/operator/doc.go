// Package operator is the library side of the operator commands
// (`outbox-relay status`, `pause`, `resume`, `checkpoint show|set`): it
// reads the progress rows, the backlog of an outbox table and the
// instances of outbox_relay_instances as operators see them (ReadStatus,
// ReadBacklog, ReadInstances), and changes what an operator may change:
// the status (Pause, Resume, then Wake the leader) and the stored position
// (SetPosition, fenced by the epoch read). It takes no leadership and
// runs nothing in the background.
package operator
