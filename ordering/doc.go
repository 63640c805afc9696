// Package ordering keeps the bookkeeping between reading outbox rows and
// acknowledging them: which lane a row is published on, which transactions
// are still waiting for broker outcomes, and the low watermark — the position
// after the longest prefix of transactions whose every message has an outcome —
// which is the only position the relay may checkpoint.
//
// It is pure logic: it publishes nothing and queries nothing, so the relay's
// correctness rules (never checkpoint past an unconfirmed message, bound memory
// in bytes) are unit-tested here without servers.
package ordering
