// Package replay republishes the outbox rows that a range of the binlog
// inserted: `outbox-relay replay` (docs/operations.md).
//
// A replay is a separate binlog reader with its own replica server id, so it
// runs next to the relay without disturbing it. It resolves the range to two
// positions (GTID sets, or times mapped to positions through the binlog's
// event times), refuses a start the server has purged, streams the range
// with canal.Tailer (only the outbox table's WRITE_ROWS rows are decoded),
// filters the rows, and publishes each as the original message plus the
// header x-replay: true, with publisher confirms and in binlog order per
// partition key (rows of one key always go to the same publish.Channel).
//
// It never writes to the database: not the progress row, not the outbox, not
// outbox_failed. A message the broker returns or rejects is reported in the
// Summary (count and message ids), not stored. Run returns after every
// published message has an outcome.
package replay
