// Command outbox-relay publishes the rows applications insert into a MySQL or
// MariaDB outbox table to RabbitMQ, and manages the tables it needs.
//
// Usage:
//
//	outbox-relay <command> [flags]
//	outbox-relay help [command]
//
// Commands:
//
//	run            relay outbox rows to RabbitMQ (binlog, or polling)
//	migrate        create the outbox, progress, failed and deduplication tables
//	status         show each relay's status, leader, standbys, checkpoint and backlog
//	pause          pause a relay: its leader stops reading and publishing, keeping leadership
//	resume         resume a paused relay where it stopped
//	checkpoint     show or set a relay's checkpoint (show | set --gtid SET | set --file F --pos N)
//	replay         republish the outbox rows a binlog range inserted, with x-replay: true
//	failed         list, show, retry or purge the messages in outbox_failed
//	cleanup        delete rows marked delivered (--on-delivered=mark) older than an age
//	dedup-cleanup  delete inbox records older than an age (not below --dedup-min-age)
//	partitions     add and drop the daily partitions of a partitioned outbox table
//	bench          measure the relay on this machine
//	version        print the version
//
// The housekeeping commands (failed, cleanup, dedup-cleanup, partitions)
// take an age as a Go duration (90m, 36h) or whole days (7d, 30d), print a
// table for people or one JSON object with --json, and have --dry-run where
// they change data. run --maintenance-interval does cleanup, dedup-cleanup
// and partitions on the leader. docs/operations.md, "Failed messages and
// housekeeping", has the details; "Status and checkpoint" covers status and
// checkpoint, "Pause and resume" pause and resume.
//
// Every flag can also come from the environment variable
// OUTBOX_RELAY_<FLAG> (upper snake case: --mysql-dsn is
// OUTBOX_RELAY_MYSQL_DSN) or from a YAML file named by --config (or
// OUTBOX_RELAY_CONFIG) whose keys are flag names:
//
//	mysql-dsn: app:secret@tcp(db:3306)/shop
//	table: outbox
//	log-format: console
//
// A flag on the command line wins over the environment, the environment over
// the file, the file over the default. An empty environment variable counts
// as unset. A file key that is no flag of any command is an error; a key that
// belongs to another command is ignored, so one file can serve all commands.
// The flags that override a safety check (checkpoint set --force,
// dedup-cleanup --force, failed retry --all, run --accept-lost-gtids) count
// only when typed on the command line: set in the environment or the file
// they are refused (exit 2).
//
// --mysql-dsn defaults to root@tcp(127.0.0.1:3306)/outbox, a local
// development server; the database it names must exist (migrate says how to
// create it when it does not). Every command that takes it also takes
// --mysql-tls-ca, --mysql-tls-cert, --mysql-tls-key and --mysql-password-file;
// the DSN's tls parameter and these hold for every connection, the binlog
// stream's included (internal/mysqlconn; docs/operations.md, "Security").
//
// Exit codes: 0 success; 1 runtime failure (database unreachable, schema
// mismatch, ...); 2 bad usage or configuration (unknown flag, bad value,
// unknown config key) or a refused request (an id that is not a UUID, a
// message that cannot be retried, an inbox age below the floor), with a
// one-line message saying what to fix.
//
// Logs are JSON on stderr (--log-format console for people), except that the
// operator commands (all but run and bench) log in console form at warn when
// stderr is a terminal and neither flag is given; command output goes to
// stdout. Every command's error names the fix (explainError), and an
// OUTBOX_RELAY_* variable no command reads is reported on stderr. Passwords in DSNs and AMQP URLs are never printed: DSNs and
// URLs are shown masked (internal/redact), and everything a command writes,
// and /readyz, is filtered of the passwords of its --mysql-dsn and --amqp-url.
//
// TLS to RabbitMQ: an amqps:// --amqp-url with --amqp-tls-ca, and
// --amqp-tls-cert and --amqp-tls-key for a client certificate (alone, without
// a password, it logs in with SASL EXTERNAL); --amqp-password-file instead of
// a password in the URL, read again at every connect. run, replay and bench
// take them; docs/operations.md, "Security", has the details.
package main
