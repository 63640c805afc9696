// Package validator checks what a consumer received against what producers
// committed: every message arrived (completeness), how often (exactly once or
// at least once), first deliveries in commit order per partition, and each
// message's body, headers and AMQP properties equal to its row (docs/wire.md).
// It is the heart of the relay's integration tests.
package validator
