package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/internal/mysqlconn"
	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// mysqlFlags are the flags of the MySQL connection, declared by
// declareMySQL for every command that connects to MySQL.
type mysqlFlags struct {
	dsn, tlsCA, tlsCert, tlsKey, passwordFile string
}

// declareMySQL declares --mysql-dsn (with the given default and help) and
// the TLS and password-file flags that complete it.
func declareMySQL(fs *flag.FlagSet, defaultDSN, dsnHelp string) *mysqlFlags {
	m := &mysqlFlags{}
	fs.StringVar(&m.dsn, "mysql-dsn", defaultDSN, dsnHelp+"; its tls parameter (true, skip-verify, preferred) holds for every connection, the binlog's too")
	fs.StringVar(&m.tlsCA, "mysql-tls-ca", "", "PEM `file` of the CA that signed the MySQL server's certificate: TLS, verifying the certificate and the DSN's host name")
	fs.StringVar(&m.tlsCert, "mysql-tls-cert", "", "PEM `file` of the client certificate to present (users created REQUIRE X509); with --mysql-tls-key; turns TLS on")
	fs.StringVar(&m.tlsKey, "mysql-tls-key", "", "PEM `file` of the private key of --mysql-tls-cert")
	fs.StringVar(&m.passwordFile, "mysql-password-file", "", "`file` holding the MySQL password (trailing line breaks are ignored), read again at every new connection, so a rotated password needs no restart; the DSN then has none")
	return m
}

// declareTable declares --table, the outbox table, into p.
func declareTable(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "table", outbox.DefaultTable, "outbox table `name`")
}

// declareRelayName declares --relay-name into p; help says what the
// command does with it.
func declareRelayName(fs *flag.FlagSet, p *string, def, help string) {
	fs.StringVar(p, "relay-name", def, help)
}

// declareJSON declares --json into p; help says what it prints.
func declareJSON(fs *flag.FlagSet, p *bool, help string) {
	fs.BoolVar(p, "json", false, help)
}

// dbFlags are the flags of a command that works on the relay's tables:
// the connection, the outbox table, the relay name and --json.
type dbFlags struct {
	mysql            *mysqlFlags
	table, relayName string
	json             bool
}

// declareDB declares the flags of dbFlags; relayHelp, relayDefault and
// jsonHelp say what the command does with them.
func declareDB(fs *flag.FlagSet, relayHelp, relayDefault, jsonHelp string) *dbFlags {
	d := &dbFlags{mysql: declareMySQL(fs, defaultDSN, "MySQL/MariaDB `dsn` user:pass@tcp(host:port)/dbname")}
	declareTable(fs, &d.table)
	declareRelayName(fs, &d.relayName, relayDefault, relayHelp)
	declareJSON(fs, &d.json, jsonHelp)
	return d
}

// open checks --table and connects to the database.
func (d *dbFlags) open(ctx context.Context) (*sql.DB, error) {
	if _, err := outbox.QuoteTable(d.table); err != nil {
		return nil, usagef("--table: %v", err)
	}
	db, _, err := openMySQL(ctx, d.mysql)
	return db, err
}

// options are the flags as mysqlconn takes them.
func (m *mysqlFlags) options() mysqlconn.Options {
	return mysqlconn.Options{DSN: m.dsn, TLSCA: m.tlsCA, TLSCert: m.tlsCert, TLSKey: m.tlsKey, PasswordFile: m.passwordFile}
}

// target checks the flags; every problem is a usage error.
func (m *mysqlFlags) target() (*mysqlconn.Target, error) {
	t, err := mysqlconn.New(m.options())
	if err != nil {
		if _, perr := mysql.ParseDSN(m.dsn); perr != nil {
			return nil, usagef("--mysql-dsn %q: %v; the form is user:pass@tcp(host:port)/dbname", redact.DSN(m.dsn), redact.ParseError(perr, m.dsn))
		}
		return nil, usagef("%v", err)
	}
	return t, nil
}

// openMySQL checks the flags, opens a pool and pings the server. Flags that
// do not parse, contradict each other or name no database are a usage
// error, and so is a TLS failure (canal.TLSError: the settings are wrong);
// an unreachable server or a missing database is a runtime error whose
// message says what to do. Messages show the DSN with its password masked.
func openMySQL(ctx context.Context, m *mysqlFlags) (*sql.DB, string, error) {
	t, err := m.target()
	if err != nil {
		return nil, "", err
	}
	if t.DBName() == "" {
		return nil, "", usagef("--mysql-dsn %q names no database; add it after the slash: user:pass@tcp(host:port)/dbname", redact.DSN(m.dsn))
	}
	db, err := t.OpenDB(mysqlconn.DialTimeout)
	if err != nil {
		return nil, "", usagef("%v", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		err = t.Explain(pingCtx, err)
		var me *mysql.MySQLError
		var te *canal.TLSError
		switch {
		case errors.As(err, &te):
			return nil, "", usagef("connect to MySQL %q: %v", redact.DSN(m.dsn), err)
		case errors.As(err, &me) && me.Number == 1049: // ER_BAD_DB_ERROR
			return nil, "", fmt.Errorf("database %q does not exist on %s; create it first (CREATE DATABASE `%s` CHARACTER SET utf8mb4) or fix --mysql-dsn",
				t.DBName(), t.Addr(), t.DBName())
		}
		return nil, "", fmt.Errorf("connect to MySQL %q: %w", redact.DSN(m.dsn), err)
	}
	return db, t.DBName(), nil
}
