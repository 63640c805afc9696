package mysqlconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// Options are the MySQL settings of a command: what its flags (or a library
// caller's Config) say. Only DSN is required.
type Options struct {
	DSN string // go-sql-driver form user:pass@tcp(host:port)/db[?params]
	// TLSCA is a PEM file of the CA certificate(s) that must have signed the
	// server's certificate; the server's host name is checked too.
	TLSCA string
	// TLSCert and TLSKey are PEM files of a client certificate and its
	// private key, presented to the server (users created REQUIRE X509).
	// Both or neither.
	TLSCert, TLSKey string
	// PasswordFile holds the password (trailing line breaks removed), read
	// again before every new connection. The DSN must then carry none.
	PasswordFile string
}

// Target is a parsed, checked Options: where to connect and how. It is
// immutable and safe for concurrent use.
type Target struct {
	driver       *mysql.Config // TLS resolved; BeforeConnect reads PasswordFile
	tls          *tls.Config   // nil: plain
	tlsPreferred bool          // tls=preferred: TLS only where the server offers it
	passwordFile string
	host         string
	port         int
}

// New parses and checks o: the DSN parses, the PEM files load, the options
// do not contradict each other (--mysql-tls-ca with tls=skip-verify, a
// password in the DSN and a password file), the password file is readable.
// Every error is a configuration problem that names the flag and the fix;
// none contains the password. A DSN naming a TLS configuration registered
// with mysql.RegisterTLSConfig must be registered before New.
func New(o Options) (*Target, error) {
	cfg, err := mysql.ParseDSN(o.DSN)
	if err != nil {
		return nil, fmt.Errorf("Config.MySQLDSN does not parse (want user:pass@tcp(host:port)/db): %v", redact.ParseError(err, o.DSN))
	}
	t := &Target{passwordFile: o.PasswordFile}
	t.host, t.port = splitAddr(cfg.Addr)
	if err := t.setTLS(cfg, o); err != nil {
		return nil, err
	}
	if o.PasswordFile != "" {
		if cfg.Passwd != "" {
			return nil, errors.New("the MySQL password is given twice, in Config.MySQLDSN and in Config.MySQLPasswordFile: remove it from the DSN (user@tcp(host:port)/db)")
		}
		if _, err := ReadPasswordFile(o.PasswordFile); err != nil {
			return nil, err
		}
		path := o.PasswordFile
		if err := cfg.Apply(mysql.BeforeConnect(func(_ context.Context, c *mysql.Config) error {
			p, err := ReadPasswordFile(path)
			if err != nil {
				return err
			}
			c.Passwd = p
			return nil
		})); err != nil {
			return nil, fmt.Errorf("Config.MySQLPasswordFile: %w", err)
		}
	}
	t.driver = cfg
	return t, nil
}

// setTLS resolves the TLS configuration of both sides from the DSN's tls
// parameter (already resolved by ParseDSN into cfg.TLS) and the PEM files.
func (t *Target) setTLS(cfg *mysql.Config, o Options) error {
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return errors.New("Config.MySQLTLSCert and Config.MySQLTLSKey go together: give both (the client certificate and its private key) or neither")
	}
	tc := cfg.TLS
	if o.TLSCA != "" {
		switch cfg.TLSConfig {
		case "", "true":
		case "false", "skip-verify", "preferred":
			return fmt.Errorf("Config.MySQLTLSCA verifies the server, but Config.MySQLDSN says tls=%s: remove the tls parameter from the DSN (or set tls=true)", cfg.TLSConfig)
		default:
			return fmt.Errorf("Config.MySQLDSN names the registered TLS configuration %q: give the CA in that configuration, or drop the tls parameter and keep Config.MySQLTLSCA", cfg.TLSConfig)
		}
		pool, err := loadCA(o.TLSCA)
		if err != nil {
			return err
		}
		tc = &tls.Config{RootCAs: pool, ServerName: t.host}
	}
	if o.TLSCert != "" {
		if cfg.TLSConfig == "false" {
			return errors.New("Config.MySQLTLSCert and Config.MySQLTLSKey need TLS, but Config.MySQLDSN says tls=false: remove the tls parameter from the DSN")
		}
		pair, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			return fmt.Errorf("Config.MySQLTLSCert %s and Config.MySQLTLSKey %s: %v: give the PEM client certificate and its private key", o.TLSCert, o.TLSKey, err)
		}
		if tc == nil {
			// As tls=true: verify the server with the system's CAs.
			tc = &tls.Config{ServerName: t.host}
		} else {
			tc = tc.Clone()
		}
		tc.Certificates = append(tc.Certificates, pair)
	}
	cfg.TLS = tc
	t.tls = tc
	t.tlsPreferred = tc != nil && cfg.AllowFallbackToPlaintext
	return nil
}

// loadCA reads a PEM file of CA certificates into a pool.
func loadCA(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("Config.MySQLTLSCA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("Config.MySQLTLSCA %s holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path)
	}
	return pool, nil
}

// ReadPasswordFile reads Config.MySQLPasswordFile (redact.ReadPasswordFile).
func ReadPasswordFile(path string) (string, error) {
	p, err := redact.ReadPasswordFile(path)
	if err != nil {
		return "", fmt.Errorf("Config.MySQLPasswordFile: %w", err)
	}
	return p, nil
}

// splitAddr splits host:port; an address without a port (a unix socket
// path) is the host, with port 3306.
func splitAddr(addr string) (string, int) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, canal.DefaultPort
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return host, canal.DefaultPort
	}
	return host, port
}

// Driver is a copy of the go-sql-driver configuration, TLS and password
// file included, for the caller to adjust (ParseTime, Timeout, session
// parameters) before mysql.NewConnector.
func (t *Target) Driver() *mysql.Config { return t.driver.Clone() }

// DefaultDialTimeout bounds a connection attempt of a pool opened with
// DialTimeout when the DSN sets no timeout: the OS default can be minutes.
const DefaultDialTimeout = 10 * time.Second

// DialTimeout is an OpenDB adjustment: connection attempts give up after
// DefaultDialTimeout unless the DSN sets a timeout.
func DialTimeout(cfg *mysql.Config) {
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultDialTimeout
	}
}

// UTC is an OpenDB adjustment for a pool that reads and writes DATETIME(6)
// values as UTC: they scan into time.Time in UTC, and the session time zone
// is +00:00, so that NOW(6) and the stored values agree whatever the
// server's zone is.
func UTC(cfg *mysql.Config) {
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
}

// OpenDB opens a pool on the Driver configuration after adjust (nil: none;
// DialTimeout, UTC or the caller's own) changed it. It does not connect.
func (t *Target) OpenDB(adjust func(*mysql.Config)) (*sql.DB, error) {
	connector, err := t.Connector(adjust)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(connector), nil
}

// Connector is the connector OpenDB opens its pool on, for a caller that
// wraps it.
func (t *Target) Connector(adjust func(*mysql.Config)) (driver.Connector, error) {
	cfg := t.Driver()
	if adjust != nil {
		adjust(cfg)
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("Config.MySQLDSN: %v", t.scrub(err.Error()))
	}
	return connector, nil
}

// Binlog is a canal.Config with the connection fields filled in (Host, Port,
// User, the password or the password file, TLS, TLSPreferred) and Schema
// set to the DSN's database; the caller adds the rest.
func (t *Target) Binlog() canal.Config {
	c := canal.Config{
		Host: t.host, Port: t.port, User: t.driver.User, Password: t.driver.Passwd,
		TLS: t.tls, TLSPreferred: t.tlsPreferred, Schema: t.driver.DBName,
	}
	if path := t.passwordFile; path != "" {
		c.PasswordFunc = func() (string, error) { return ReadPasswordFile(path) }
	}
	return c
}

// Explain names a failed connection's TLS problem (a *canal.TLSError, see
// canal.ExplainConnectError) and returns other errors unchanged.
func (t *Target) Explain(ctx context.Context, err error) error {
	return canal.ExplainConnectError(ctx, t.Binlog(), err)
}

// DBName is the DSN's database ("" when it names none).
func (t *Target) DBName() string { return t.driver.DBName }

// Addr is the server's address as the DSN gives it (host:port).
func (t *Target) Addr() string { return t.driver.Addr }

// scrub masks the DSN's password in msg.
func (t *Target) scrub(msg string) string {
	return redact.Scrub(msg, []string{t.driver.Passwd})
}
