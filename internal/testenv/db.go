package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// DB is a fresh, empty database (utf8mb4, utf8mb4_unicode_ci) for one test,
// dropped at cleanup.
type DB struct {
	Server *Server // the private server it lives on; nil on an external server
	Name   string  // database name: derived from the test name plus a random suffix
	DSN    string  // go-sql-driver DSN as root on this database: multiStatements=true, no parseTime; on a TLS server no tls parameter either (SQL uses TLS)
	SQL    *sql.DB // pool on DSN, closed at cleanup
	Host   string  // server host
	Port   int     // server port
	// User and Password: root without a password on private servers, the
	// credentials of OUTBOX_TEST_MYSQL_DSN on an external one.
	User, Password string

	cfg *mysql.Config // the configuration of DSN, TLS included
}

// Migrate applies the project's migrations with their defaults (the outbox
// table and the relay's own tables) to the database, failing the test when
// they fail, and returns d.
func (d *DB) Migrate(ctx context.Context, t testing.TB) *DB {
	t.Helper()
	if _, err := migrations.Apply(ctx, d.SQL, migrations.Options{}); err != nil {
		t.Fatalf("testenv: migrate %s: %v", d.Name, err)
	}
	return d
}

// Pool opens another pool on the database, its configuration changed by
// adjust first (mysqlconn.UTC: times as the relay reads them), closed at
// cleanup.
func (d *DB) Pool(t testing.TB, adjust func(*mysql.Config)) *sql.DB {
	t.Helper()
	cfg := d.cfg.Clone()
	adjust(cfg)
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatalf("testenv: open pool on %s: %v", d.Name, err)
	}
	pool := sql.OpenDB(connector)
	t.Cleanup(func() { pool.Close() })
	return pool
}

// dropTimeout bounds the DROP DATABASE at cleanup, which waits for metadata
// locks that connections the test left open may still hold.
const dropTimeout = 30 * time.Second

// CreateDatabase creates a fresh empty database on this server for the test,
// like MySQL does on the shared server. It is dropped at cleanup.
func (s *Server) CreateDatabase(t testing.TB) *DB {
	t.Helper()
	return createDatabase(t, s, s.config(""))
}

// createDatabase creates the test's database on the server that base (a
// configuration without a database) points at.
func createDatabase(t testing.TB, srv *Server, base *mysql.Config) *DB {
	t.Helper()
	name := objectName(t.Name(), "t_", "_", 64)
	host, portText, err := net.SplitHostPort(base.Addr)
	if err != nil {
		t.Fatalf("testenv: MySQL address %q: %v", base.Addr, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		t.Fatalf("testenv: MySQL address %q: %v", base.Addr, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := execOnce(ctx, base, "CREATE DATABASE "+quoteIdent(name)+" CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"); err != nil {
		if srv == nil {
			unavailable(t, "MySQL at %s (%s) cannot be used: %v", base.Addr, EnvMySQLDSN, err)
		}
		t.Fatalf("testenv: create database %s on %s: %v", name, base.Addr, err)
	}

	cfg := base.Clone()
	cfg.DBName = name
	d := &DB{
		Server:   srv,
		Name:     name,
		DSN:      cfg.FormatDSN(),
		Host:     host,
		Port:     port,
		User:     cfg.User,
		Password: cfg.Passwd,
		cfg:      cfg,
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatalf("testenv: open pool on %s: %v", d.Name, err)
	}
	d.SQL = sql.OpenDB(connector)
	t.Cleanup(func() {
		d.SQL.Close()
		if srv != nil && !srv.running() {
			return // the server and its datadir go away with it
		}
		ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
		defer cancel()
		if err := execOnce(ctx, base, "SET SESSION lock_wait_timeout = 20; DROP DATABASE IF EXISTS "+quoteIdent(name)); err != nil {
			t.Errorf("testenv: drop database %s on %s at cleanup: %v", name, base.Addr, err)
		}
	})
	return d
}

// execOnce runs statements on a connection of its own, so that it does not
// depend on a pool whose connections a test may have broken.
func execOnce(ctx context.Context, cfg *mysql.Config, query string) error {
	cfg = cfg.Clone()
	cfg.MultiStatements = true
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return err
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	_, err = db.ExecContext(ctx, query)
	return err
}

// queryOnce reads a single value on a connection of its own.
func queryOnce(ctx context.Context, cfg *mysql.Config, query string, dest any) error {
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return err
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	return db.QueryRowContext(ctx, query).Scan(dest)
}

func quoteIdent(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

// objectName derives a unique name for a database, exchange or queue from a
// test name: prefix, the test name reduced to [a-z0-9_] (runs of other
// characters, such as the '/' of subtests, become one '_'), sep and 8 random
// hex digits, at most max bytes in all.
func objectName(testName, prefix, sep string, max int) string {
	suffix := fmt.Sprintf("%s%08x", sep, rand.Uint32())
	var b strings.Builder
	lastUnderscore := false
	for _, r := range strings.ToLower(testName) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			lastUnderscore = false
		} else if !lastUnderscore {
			b.WriteByte('_')
			lastUnderscore = true
		}
	}
	base := strings.Trim(b.String(), "_")
	if room := max - len(prefix) - len(suffix); len(base) > room {
		base = strings.TrimRight(base[:room], "_")
	}
	return prefix + base + suffix
}
