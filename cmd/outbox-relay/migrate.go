package main

import (
	"context"
	"flag"
	"fmt"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// defaultDSN is a local development server's root account and a database
// named "outbox", which must exist. Production sets --mysql-dsn.
const defaultDSN = "root@tcp(127.0.0.1:3306)/outbox"

func init() {
	register(&command{
		name:    "migrate",
		summary: "create or complete the outbox-relay tables (safe to run repeatedly)",
		help: `Creates what is missing of the outbox table (--table), outbox_relay_progress,
outbox_failed, outbox_relay_instances, message_deduplication,
message_inbox_attempts and stream_consumer_offsets, upgrades tables made by earlier versions in place
(created_at's default computed in UTC, the inbox's consumer column, the progress
row's pause columns, failed_at, broker, confirms_stalled_at, outbox_table and
leader_lease_ms), and records the applied versions in outbox_relay_migrations.
Prints each version it applied, or "schema is up to date". Never drops anything and never loses rows. An existing
table whose columns differ from what the relay needs is refused with a message
naming the column (exit code 1). The DSN's database must exist.

--partitioned creates the outbox table range-partitioned by UTC day on
created_at, with a pmax partition at the end; it matters only when the table
is created (docs/tables.md).`,
		setup: setupMigrate,
	})
}

func setupMigrate(fs *flag.FlagSet) runFunc {
	my := declareMySQL(fs, defaultDSN, "MySQL/MariaDB `dsn` in go-sql-driver form user:pass@tcp(host:port)/dbname; the database must exist")
	table := new(string)
	declareTable(fs, table)
	partitioned := fs.Bool("partitioned", false, "create the outbox table range-partitioned by day on created_at")
	return func(ctx context.Context, inv *invocation) error {
		if err := noArgs(inv, "migrate"); err != nil {
			return err
		}
		if _, err := outbox.QuoteTable(*table); err != nil {
			return usagef("--table: %v", err)
		}
		db, dbName, err := openMySQL(ctx, my)
		if err != nil {
			return err
		}
		defer db.Close()

		applied, err := migrations.Apply(ctx, db, migrations.Options{Table: *table, Partitioned: *partitioned})
		for _, v := range applied {
			fmt.Fprintf(inv.stdout, "applied %s\n", v)
		}
		if err != nil {
			return fmt.Errorf("migrate database %q: %w", dbName, err)
		}
		if len(applied) == 0 {
			fmt.Fprintln(inv.stdout, "schema is up to date")
		}
		inv.log.Info("schema migrated", zap.String("database", dbName), zap.String("table", *table),
			zap.Bool("partitioned", *partitioned), zap.Strings("applied", applied))
		return nil
	}
}
