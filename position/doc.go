// Package position names a point in a MySQL or MariaDB binlog: a GTID set,
// or a file and offset on servers without GTIDs. The tailer streams from
// one, the checkpoint stores one, and the handover asks whether the stream
// has reached one; they all use this one type. GTIDs is the set of
// transactions a reader has passed, for "was this transaction seen?" asked
// exactly (the tailer's duplicate guard, the handover window's end).
package position
