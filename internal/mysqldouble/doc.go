// Package mysqldouble is a test double of a MySQL 8.0 or 8.4 primary, for
// running the relay on MySQL-shaped streams where no MySQL server can be
// installed (the tests' real server is MariaDB).
//
// It has two halves. Encoder writes binlog events byte for byte as MySQL
// writes them: FORMAT_DESCRIPTION (MySQL's post-header table), GTID,
// ANONYMOUS_GTID and GTID_TAGGED (uuid:tag:n, mysql::serialization),
// QUERY, TABLE_MAP with binlog_row_metadata=FULL optional metadata,
// WRITE_ROWS v2 (the outbox table's column types, MySQL's binary JSON),
// XID, TRANSACTION_PAYLOAD (zstd, as binlog_transaction_compression=ON),
// ROTATE and HEARTBEAT, with CRC32 checksums. canal's tests compare these
// bytes with binlog files real MySQL servers wrote and decode both with
// the tailer's own decoder, so the double cannot drift from MySQL.
//
// Server speaks the client protocol (go-mysql's server package), answers
// the statements the preflight and the position reads make as the chosen
// Version does (8.4: SHOW MASTER STATUS and SHOW SLAVE HOSTS are syntax
// errors, SHOW BINARY LOG STATUS answers; 8.0 the other way round), with
// @@gtid_executed as a UUID set, SHOW GRANTS in MySQL's form and
// performance_schema.log_status, and serves COM_BINLOG_DUMP_GTID from the
// binlog files it holds, skipping the transactions the replica has, as
// MySQL does; a test appends transactions (Commit) while dumps are live.
//
// What it does not do: run SQL. Statements other than those listed answer
// a syntax error naming them, so a new statement in the relay shows up as
// a failing test, not as a silent wrong answer.
package mysqldouble
