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
//	migrate   create the outbox, progress, failed and deduplication tables
//	version   print the version
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
//
// --mysql-dsn defaults to root@tcp(127.0.0.1:3306)/outbox, a local
// development server; the database it names must exist (migrate says how to
// create it when it does not).
//
// Exit codes: 0 success; 1 runtime failure (database unreachable, schema
// mismatch, ...); 2 bad usage or configuration (unknown flag, bad value,
// unknown config key), with a one-line message saying what to fix.
//
// Logs are JSON on stderr (--log-format console for people); command output
// goes to stdout. Passwords in DSNs and AMQP URLs are never printed.
package main
