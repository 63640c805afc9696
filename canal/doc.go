// Package canal tails a MySQL or MariaDB binlog and turns it into the
// transactions of one outbox table.
//
// A Tailer reads the binlog with go-mysql's replication.BinlogSyncer (its own
// retry off), decodes only the rows events whose TABLE_MAP names the outbox
// table (everything else is skipped undecoded), maps WRITE_ROWS rows to
// outbox.Record by the column names in the TABLE_MAP (binlog_row_metadata=FULL),
// and hands them to a Handler, followed by one Commit per transaction carrying
// the position after it. Transient read errors are retried inside Run from the
// last committed transaction; the rows of a half-read transaction that the
// handler already saw are skipped on the re-read, so the handler sees every row
// exactly once. Preflight, CheckPosition, CurrentPosition and SnapshotPosition
// are the SQL-side checks and reads the relay makes before it starts tailing.
//
// Connections: every connection the tailer opens (the binlog stream, the
// flavor detection, CheckConnection) uses Config's TLS (nil: plain; with
// TLSPreferred, plain where the server offers no TLS) and asks PasswordFunc,
// when set, for the password each time. A TLS failure is a *TLSError naming
// the fix (ExplainConnectError tells MariaDB's "access denied" for a missing
// TLS from a wrong password), never an *AccessError.
//
// Time zone: DATETIME columns have no zone. The tailer reads created_at and
// available_at as UTC, so producers must write them in UTC (sessions with
// time_zone='+00:00', or explicit UTC values).
package canal
