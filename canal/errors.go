package canal

import (
	"fmt"
	"strings"

	"github.com/outbox-relay/outbox-relay/position"
)

// Names of the preflight checks, the Check field of a PreflightError.
const (
	CheckLogBin      = "log_bin"
	CheckFormat      = "binlog_format"
	CheckRowImage    = "binlog_row_image"
	CheckRowMetadata = "binlog_row_metadata"
	CheckReplSlave   = "REPLICATION SLAVE"
	CheckReplClient  = "REPLICATION CLIENT"
	CheckServerID    = "server_id"
	CheckGTIDMode    = "gtid_mode"
)

// PreflightError is a server setting or grant that makes binlog mode
// impossible. Its message is one line: what is wrong, then how to fix it.
// The tailer also returns it from Run when the stream itself shows the
// problem (a TABLE_MAP without column names, a row image without all columns).
type PreflightError struct {
	Check   string // one of the Check* constants
	Problem string // what was found, e.g. "binlog_format is STATEMENT"
	Fix     string // what to do, e.g. "set binlog_format=ROW (...)"
}

func (e *PreflightError) Error() string { return e.Problem + ": " + e.Fix }

// SchemaError reports an outbox table whose binlog shape is not the one the
// tailer maps: a required column missing (renamed or dropped, typically DDL
// while running) or of an unexpected type. Re-reading the same events gives
// the same error: the relay must get past them another way (poll mode reads
// the rows by today's column names).
type SchemaError struct {
	Schema, Table string
	Column        string   // the offending column
	Reason        string   // empty when the column is missing
	GTID          string   // the transaction whose event showed it ("" before the first row)
	Columns       []string // the columns of the event's table map
}

func (e *SchemaError) Error() string {
	var where string
	if e.GTID != "" {
		where = " in transaction " + e.GTID
	}
	if len(e.Columns) > 0 {
		where += " (table map columns: " + strings.Join(e.Columns, ", ") + ")"
	}
	if e.Reason != "" {
		return fmt.Sprintf("outbox column %q of %s.%s in the binlog table map%s: %s", e.Column, e.Schema, e.Table, where, e.Reason)
	}
	return fmt.Sprintf("outbox column %q missing from the binlog table map of %s.%s%s: the table's shape changed (DDL while running?)",
		e.Column, e.Schema, e.Table, where)
}

// StatementError reports a write into the outbox table that the binlog
// holds as a statement (the writing session's binlog_format was STATEMENT,
// or MIXED), not as rows: the binlog has no row values to publish, the rows
// are in the table.
type StatementError struct {
	Schema, Table string
	GTID          string // the transaction holding the statement
	Statement     string // its text, shortened
}

func (e *StatementError) Error() string {
	return fmt.Sprintf("transaction %s writes into %s.%s as a statement, not as rows (the writing session's binlog_format "+
		"was STATEMENT or MIXED): %q", e.GTID, e.Schema, e.Table, e.Statement)
}

// XACommitError reports the XA COMMIT of a transaction whose outbox rows the
// binlog holds at its XA PREPARE, earlier: the tailer never hands those
// rows over (they may yet be rolled back), and at the commit they are read
// from the table. Seen is false when the prepare is older than the stream's
// start, so whether it wrote outbox rows is unknown.
type XACommitError struct {
	GTID string // the transaction holding the XA COMMIT
	XID  string // as the binlog writes it: X'gtrid',X'bqual',formatID
	Rows int    // outbox rows of its prepare; 0 when not Seen
	Seen bool
}

func (e *XACommitError) Error() string {
	if !e.Seen {
		return fmt.Sprintf("XA COMMIT %s in transaction %s commits a transaction prepared before the binlog stream's start: "+
			"any outbox rows it wrote are in the table, not in the stream read", e.XID, e.GTID)
	}
	return fmt.Sprintf("XA COMMIT %s in transaction %s commits %d outbox rows written at its XA PREPARE, "+
		"which the stream holds back until the decision: they are read from the table", e.XID, e.GTID, e.Rows)
}

// PurgedError reports a start position the server cannot stream from: the
// binlogs holding it were purged, or the position is not in the server's
// history at all (diverged, e.g. after a failover that lost transactions).
type PurgedError struct {
	Position position.Position
	Detail   string // the server's message or what CheckPosition compared
}

func (e *PurgedError) Error() string {
	return fmt.Sprintf("binlog position %s is no longer available on the server (%s): "+
		"restart from a current position (the relay's poll-to-binlog handover delivers what was missed) "+
		"and keep binlogs longer (binlog_expire_logs_seconds / expire_logs_days)", e.Position, e.Detail)
}

// AccessError reports that the server refused the binlog connection or dump
// for lack of credentials or privileges.
type AccessError struct {
	User   string
	Detail string // the server's message
}

func (e *AccessError) Error() string {
	return fmt.Sprintf("binlog access denied for user %q (%s): check the password and "+
		"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO the relay's user", e.User, e.Detail)
}

// StopError is returned by Config.CheckServer to end Run: the server the
// stream reconnected to must not be read (the relay's lossy-failover check
// refused it). Run returns it wrapped.
type StopError struct{ Err error }

func (e *StopError) Error() string { return e.Err.Error() }
func (e *StopError) Unwrap() error { return e.Err }

// HandlerError wraps an error returned by the Handler; Run stops with it.
type HandlerError struct {
	Op  string // "Row" or "Commit"
	Err error
}

func (e *HandlerError) Error() string { return fmt.Sprintf("canal handler %s: %v", e.Op, e.Err) }
func (e *HandlerError) Unwrap() error { return e.Err }

// DivergedError reports that after a reconnect the stream did not resume with
// the transaction whose first rows the handler had already received, so
// skipping them would be wrong. It means the server's history changed under
// the tailer (failover, RESET MASTER).
type DivergedError struct {
	Expected string // the interrupted transaction
	Got      string // the first transaction after the reconnect
	Rows     int    // rows of Expected already handed over
}

func (e *DivergedError) Error() string {
	return fmt.Sprintf("binlog diverged during a reconnect: %d rows of transaction %s were delivered, "+
		"but the stream resumed with %s; restart from the durable checkpoint", e.Rows, e.Expected, e.Got)
}
