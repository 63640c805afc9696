package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/redact"
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
outbox_failed, message_deduplication and message_inbox_attempts, upgrades tables
made by earlier versions in place (created_at's default computed in UTC, the
inbox's consumer column), and records the applied versions in
outbox_relay_migrations. Prints each version it applied, or "schema is up to
date". Never drops anything and never loses rows. An existing table whose
columns differ from what the relay needs is refused with a message naming the
column (exit code 1). The DSN's database must exist.

--partitioned creates the outbox table range-partitioned by UTC day on
created_at, with a pmax partition at the end; it matters only when the table
is created (docs/tables.md).`,
		setup: setupMigrate,
	})
}

func setupMigrate(fs *flag.FlagSet) runFunc {
	dsn := fs.String("mysql-dsn", defaultDSN, "MySQL/MariaDB `dsn` in go-sql-driver form user:pass@tcp(host:port)/dbname; the database must exist")
	table := fs.String("table", outbox.DefaultTable, "outbox table `name`")
	partitioned := fs.Bool("partitioned", false, "create the outbox table range-partitioned by day on created_at")
	return func(ctx context.Context, inv *invocation) error {
		if err := noArgs(inv, "migrate"); err != nil {
			return err
		}
		if _, err := outbox.QuoteTable(*table); err != nil {
			return usagef("--table: %v", err)
		}
		db, dbName, err := openMySQL(ctx, *dsn)
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

// openMySQL checks dsn, opens a pool and pings the server. A DSN that does
// not parse or names no database is a usage error; an unreachable server or
// a missing database is a runtime error whose message says what to do.
// Messages show the DSN with its password masked.
func openMySQL(ctx context.Context, dsn string) (*sql.DB, string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, "", usagef("--mysql-dsn %q: %v; the form is user:pass@tcp(host:port)/dbname", redact.DSN(dsn), redact.ParseError(err, dsn))
	}
	if cfg.DBName == "" {
		return nil, "", usagef("--mysql-dsn %q names no database; add it after the slash: user:pass@tcp(host:port)/dbname", redact.DSN(dsn))
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second // dial timeout; the OS default can be minutes
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, "", usagef("--mysql-dsn %q: %v", redact.DSN(dsn), redact.ParseError(err, dsn))
	}
	db := sql.OpenDB(connector)
	pingCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1049 { // ER_BAD_DB_ERROR
			return nil, "", fmt.Errorf("database %q does not exist on %s; create it first (CREATE DATABASE `%s` CHARACTER SET utf8mb4) or fix --mysql-dsn",
				cfg.DBName, cfg.Addr, cfg.DBName)
		}
		return nil, "", fmt.Errorf("connect to MySQL %q: %w", redact.DSN(dsn), err)
	}
	return db, cfg.DBName, nil
}
