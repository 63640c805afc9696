// Package backoff is the retry delay every retrying part of the relay uses
// (binlog reconnects, broker redials, poll rounds, leadership and
// acknowledgement retries): exponential from a minimum, capped, with equal
// jitter so that relays cut off together do not retry in lockstep.
package backoff
