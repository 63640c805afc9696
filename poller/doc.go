// Package poller delivers pending outbox rows by polling the table: the
// relay's poll mode (--mode poll, and the fallback when the binlog cannot be
// read) and the sweep of the poll → binlog handover and the first start
// (docs/operations.md, "Modes"). It publishes each pending, due row with per-partition order
// kept, waits for the broker's confirms, and acknowledges the rows (deletes
// or marks them, moving undeliverable ones to outbox_failed) in the same
// database transaction that claimed them.
//
// # Rounds
//
// Each of Config.Workers workers owns one publish.Channel and one database
// connection, which holds one of the relay name's poll locks
// (checkpoint.PollLockName) so that a new leader can end it when this process
// stops mid-round with partition heads locked (session.go; docs/poller.md, "A
// worker's connection, and a stopped leader's locks"), and runs rounds.
// A round:
//
//  1. Candidates, outside any transaction and without locks: the id of
//     the heads — oldest pending, due rows — of the partitions found in key
//     order from a cursor, among the oldest pending rows, and among the
//     partitions the previous listing saw, and the oldest pending due rows
//     with an empty partition_key, at most Batch*(Workers+1), oldest first.
//     When there are none the round ends here: an idle poller sends this
//     one statement per Config.Interval (one worker polls; the others wait
//     until it finds rows) and nothing else.
//  2. BEGIN a READ COMMITTED transaction (no gap locks, so producers'
//     inserts never wait for the poller).
//  3. Claim: lock up to Batch of the candidates that are still pending and
//     due, oldest first, FOR UPDATE SKIP LOCKED. A head another worker holds
//     is skipped, and with it its whole partition: no later row of that
//     partition was a candidate.
//  4. Followers: if the batch has room, lock the pending due rows after the
//     claimed heads in their own partitions (FOR UPDATE SKIP LOCKED), at
//     most an equal share of the room per partition, so a hot partition
//     moves a batch per round, not a row, and a round's rows spread over
//     its partitions (their rows reach the broker one confirm after another
//     per key). A round over fewer than Batch/4 partitions, once the
//     listings have settled (the last found no partition new to them),
//     takes up to 4 × Batch rows: the claim and the commit, when none of
//     those partitions has a message on the wire, come once per four
//     batches. Past its first Batch rows it locks another Batch of them
//     only while that many, at the average size of the rows it holds, keep
//     it within 16 MiB (a round of Batch rows has no byte bound). With more heads than room, only the oldest heads get a
//     follower (one index dive each).
//  5. Publish the claimed rows in id order on the worker's channel
//     (publish.FromRecord with the poller's epoch), then Flush: wait until
//     every message has its Result.
//  6. In the same transaction, checkpoint.Store.AckRows: every claimed row
//     is deleted (or marked delivered); rows the broker returned or
//     rejected, and rows that cannot be published as they are, are copied
//     to outbox_failed first, so their partition moves on.
//  7. Fence: SELECT epoch ... LOCK IN SHARE MODE on the progress row; an
//     epoch other than the poller's is checkpoint.ErrFenced and the round
//     rolls back. Then COMMIT.
//
// Delivery is at-least-once: a crash, a lost connection or a fence failure
// after step 5 leaves the rows pending, and they are published again. So
// does the end of the caller's context during a round: Run, RunUntil, Drain
// and DrainUntil report rounds rolled back that way after publishing as a
// *CutError with the count of their messages. RunUntil and DrainUntil also
// take a stop channel that ends them between rounds, the rounds under way
// committing: nothing is published again.
// Nothing is lost: a row leaves the pending set only in the transaction
// that committed after its confirm.
//
// # Order
//
// Within a partition rows are delivered in id order, which is commit order
// for a producer that commits its partition's rows one transaction after
// another. A partition is held by one round at a time (its head's row
// lock), and the next round can only see the next head after that round
// committed, i.e. after all its Results.
//
// "Pending" is delivered_at IS NULL (the relay never sets it in delete
// mode, where delivered rows are gone). "Due" is available_at IS NULL or
// available_at <= UTC_TIMESTAMP(6). A partition's head is its oldest
// pending row that is due: a delayed row (available_at in the future) does
// not hold back the due rows after it in its partition, which are delivered
// before it; it is delivered once due, as the oldest pending row of its
// partition at that time (docs/operations.md, "Delayed messages"). Rows with an empty partition_key have no
// order and are claimed freely.
//
// # Files
//
// poller.go holds the API (New, Run, RunUntil, Drain, DrainUntil, the
// errors) and starts and ends a call's workers; worker.go a worker's loop
// between rounds (retries, waits, stop); round.go one round (candidates and
// their cursor, publish, acknowledge, fence, commit); claim.go the claim of
// a round's heads and their followers, and how deep a round goes;
// commits.go how the workers of a call wait for each other's commits;
// session.go a worker's connection and its poll lock; query.go the SQL;
// delayed.go the DelayedSweeper of binlog mode; config.go Config.
//
// docs/poller.md has the SQL, the EXPLAIN plans behind the indexes it
// needs (idx_head, idx_partition_id, idx_due of migrations/sql) and the
// measurements.
package poller
