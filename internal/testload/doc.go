// Package testload writes outbox workloads for integration tests: several
// concurrent producers, each owning a set of partitions, committing a mix of
// one-row and large transactions, and telling a validator.Validator what they
// committed, in commit order per partition. MessageIDsAfter reads from the
// binlog which messages a relay resuming from a position reads again (the
// most it may publish twice). It is shared by the in-process relay and
// poller tests and the tests that run the outbox-relay binary.
package testload
