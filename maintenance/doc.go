// Package maintenance holds the operator's jobs on the relay's tables:
// failed messages (list, show, retry and purge rows of outbox_failed), the
// cleanup of delivered rows (--on-delivered=mark) and of old inbox records
// (message_deduplication), and the daily partitions of an outbox table made
// with `migrate --partitioned`. The CLI's failed, cleanup, dedup-cleanup
// and partitions commands call the jobs; Round runs the cleanups and the
// partition upkeep together, as a relay's leader does every
// `run --maintenance-interval` (relay.Config.Maintenance).
//
// Contracts shared by the jobs:
//
//   - Times are UTC, as everywhere in the relay's tables. An age ("older
//     than 7 days") becomes a cutoff computed once per call by the server,
//     UTC_TIMESTAMP(6) minus the age, so the client's clock and the
//     session's time_zone play no part.
//   - Deletes go in batches. A non-locking read lists at most Batch.Size
//     keys after a cursor; then one short READ COMMITTED transaction
//     deletes exactly those rows, named by primary key (point lookups: it
//     locks only them, never a gap or a producer's uncommitted row next to
//     them), re-checking the condition. A concurrent producer therefore
//     waits at most for one batch's commit, never for the whole job, and a
//     job stopped half way (context end, error) leaves a consistent table:
//     run it again to finish.
//   - Every job that changes data has a dry run that only reads and
//     reports what it would change. Retry and Partitions first compute a
//     plan without changing anything (what to retry and skip; what to add,
//     drop and keep), which the dry run reports and the real run applies.
//   - A failure in outbox_failed is named by its message id (every failure
//     of that message) or by its row id (that failure alone); the zero
//     message id, which the inbox stores for message ids that were not
//     UUIDs, names nothing. Retry deletes only the failed rows it put back,
//     in the transaction that puts them back; purge deletes only the rows
//     it was asked to.
//   - A request the package refuses to carry out (an age below the inbox
//     floor, a table that is not partitioned, a message that cannot be
//     retried) is a *RefusedError; any other error is a runtime failure.
package maintenance
