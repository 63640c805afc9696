package canal

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/go-mysql-org/go-mysql/mysql"
	driver "github.com/go-sql-driver/mysql"
)

// connectTimeout bounds the TCP dial of every go-mysql connection.
const connectTimeout = 10 * time.Second

// erSecureTransportRequired is MySQL's refusal of a connection without TLS
// by a server with require_secure_transport=ON. MariaDB answers such a
// connection with a plain "access denied" (1045) instead.
const erSecureTransportRequired = 3159

// TLSError reports a connection that failed because of TLS: the server's
// certificate did not verify, the server does not offer TLS, the server
// refused the client certificate, or the server (or the user) requires TLS
// and the connection had none. Its message is one line: what is wrong, then
// how to fix it. It never says "access denied": the grants are not the
// problem.
type TLSError struct {
	Addr    string // host:port of the server
	Problem string // what was found
	Fix     string // what to do
	Err     error  // the underlying error
}

func (e *TLSError) Error() string { return e.Problem + ": " + e.Fix }
func (e *TLSError) Unwrap() error { return e.Err }

// addr is host:port of cfg's server.
func (c *Config) addr() string { return net.JoinHostPort(c.Host, strconv.Itoa(c.Port)) }

// password is the password of the next connection: PasswordFunc's answer
// when it is set, else Password.
func (c *Config) password() (string, error) {
	if c.PasswordFunc == nil {
		return c.Password, nil
	}
	p, err := c.PasswordFunc()
	if err != nil {
		return "", fmt.Errorf("get the MySQL password for %s: %w", c.addr(), err)
	}
	return p, nil
}

// dial opens a go-mysql client connection the way the binlog connection is
// opened: cfg.TLS (without it when TLSPreferred and the server offers none),
// the password of the moment.
func dial(ctx context.Context, cfg *Config) (*client.Conn, error) {
	pw, err := cfg.password()
	if err != nil {
		return nil, err
	}
	connect := func(tc *tls.Config) (*client.Conn, error) {
		return client.ConnectWithContext(ctx, cfg.addr(), cfg.User, pw, "", connectTimeout,
			func(c *client.Conn) error { c.SetTLSConfig(tc); return nil })
	}
	c, err := connect(cfg.TLS)
	if err != nil && cfg.TLS != nil && cfg.TLSPreferred && noTLSOffered(err) {
		c, err = connect(nil)
	}
	return c, err
}

// noTLSOffered reports whether err is a client's refusal to go on with a
// server that does not offer TLS (go-mysql's or go-sql-driver's).
func noTLSOffered(err error) bool {
	return errors.Is(err, driver.ErrNoTLS) ||
		strings.Contains(err.Error(), "does not support TLS")
}

// CheckConnection connects to cfg's server as the binlog connection does
// (go-mysql's client, cfg.TLS, the password of the moment) and closes the
// connection. A TLS failure is a *TLSError (ExplainConnectError); another
// failure is returned wrapped.
func CheckConnection(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	c, err := dial(ctx, &cfg)
	if err != nil {
		if te := ExplainConnectError(ctx, cfg, err); te != err {
			return te
		}
		return fmt.Errorf("connect to %s as user %q (as the binlog connection does): %w", cfg.addr(), cfg.User, err)
	}
	return c.Close()
}

// ExplainConnectError returns a *TLSError when err, the failure of a
// connection to cfg's server with cfg's TLS settings (from go-mysql or from
// go-sql-driver), is a TLS problem, and err itself otherwise.
//
// MariaDB refuses a connection without TLS to a server with
// require_secure_transport=ON, or by a user created REQUIRE SSL, with the
// same "access denied" (1045) as a wrong password. So when a connection
// without TLS is denied, ExplainConnectError tries once more over TLS
// without verifying the server, with the same user and password: when that
// one is let in, TLS is what was missing. The probe is made only to a server
// whose greeting says MariaDB: its login exchanges (mysql_native_password,
// ed25519) send a scramble, never the password, so an unverified TLS peer
// learns no more than the refused plain connection showed. MySQL names the
// TLS requirement itself (3159), and its caching_sha2_password would send
// the password in clear inside TLS: it is never probed.
func ExplainConnectError(ctx context.Context, cfg Config, err error) error {
	if err == nil {
		return nil
	}
	if te := tlsProblem(&cfg, err); te != nil {
		return te
	}
	if cfg.TLS != nil || !accessDenied(err) {
		return err
	}
	if !greetsAsMariaDB(ctx, cfg.addr()) {
		return err
	}
	probe := cfg
	probe.TLS, probe.TLSPreferred = &tls.Config{InsecureSkipVerify: true}, false
	c, perr := dial(ctx, &probe)
	if perr != nil {
		return err
	}
	defer c.Close()
	fix := "add tls=true to Config.MySQLDSN or set Config.MySQLTLSCA"
	if r, qerr := c.Execute("SELECT @@GLOBAL.require_secure_transport"); qerr == nil {
		if v, _ := r.GetInt(0, 0); v == 1 {
			return &TLSError{Addr: cfg.addr(), Err: err, Fix: fix,
				Problem: fmt.Sprintf("the server requires TLS (require_secure_transport=ON) and the connection to %s had none", cfg.addr())}
		}
	}
	return &TLSError{Addr: cfg.addr(), Err: err, Fix: fix,
		Problem: fmt.Sprintf("user %q may connect to %s only over TLS (REQUIRE SSL) and the connection had none", cfg.User, cfg.addr())}
}

// greetsAsMariaDB reads the server's initial handshake packet, sent before
// any login, and reports whether its version string names MariaDB.
func greetsAsMariaDB(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return false
	}
	// 3 bytes of length, 1 of sequence, then protocol version 10 and the
	// NUL-terminated server version.
	buf := make([]byte, 128)
	n, _ := io.ReadAtLeast(conn, buf, 6)
	if n < 6 || buf[4] != 10 {
		return false
	}
	version, _, _ := bytes.Cut(buf[5:n], []byte{0})
	return bytes.Contains(bytes.ToLower(version), []byte("mariadb"))
}

// accessDenied reports whether err is the server's "access denied" at login.
func accessDenied(err error) bool {
	var de *driver.MySQLError
	var me *mysql.MyError
	return errors.As(err, &de) && de.Number == mysql.ER_ACCESS_DENIED_ERROR ||
		errors.As(err, &me) && me.Code == mysql.ER_ACCESS_DENIED_ERROR
}

// tlsProblem names err when it is a TLS failure by itself (no I/O).
func tlsProblem(cfg *Config, err error) *TLSError {
	addr := cfg.addr()
	te := func(problem, fix string) *TLSError {
		return &TLSError{Addr: addr, Problem: problem, Fix: fix, Err: err}
	}
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		de        *driver.MySQLError
		me        *mysql.MyError
	)
	customCA := cfg.TLS != nil && cfg.TLS.RootCAs != nil
	switch {
	case errors.As(err, &unknownCA) && customCA:
		return te(fmt.Sprintf("the server's certificate is not signed by Config.MySQLTLSCA (server %s: %v)", addr, unknownCA),
			"give Config.MySQLTLSCA the CA certificate that signed the server's certificate (the server's ssl-ca)")
	case errors.As(err, &unknownCA):
		return te(fmt.Sprintf("the server's certificate is not signed by a CA this system trusts (server %s: %v)", addr, unknownCA),
			"set Config.MySQLTLSCA to the CA certificate that signed it, or tls=skip-verify in Config.MySQLDSN to encrypt without verifying the server")
	case errors.As(err, &hostname):
		return te(fmt.Sprintf("the server's certificate does not name the host connected to (server %s: %v)", addr, hostname),
			"connect by a name or address the certificate holds (the host in Config.MySQLDSN), or reissue the server's certificate with this one")
	case errors.As(err, &invalid):
		return te(fmt.Sprintf("the server's certificate is not valid (server %s: %v)", addr, invalid),
			"renew the server's certificate (or fix this machine's clock)")
	case errors.As(err, &de) && de.Number == erSecureTransportRequired,
		errors.As(err, &me) && me.Code == erSecureTransportRequired:
		return te(fmt.Sprintf("the server requires TLS (require_secure_transport=ON) and the connection to %s had none", addr),
			"add tls=true to Config.MySQLDSN or set Config.MySQLTLSCA")
	case noTLSOffered(err):
		return te(fmt.Sprintf("the server at %s does not offer TLS, which the connection requires", addr),
			"enable TLS on the server (ssl-cert, ssl-key), or remove the tls parameter from Config.MySQLDSN, and Config.MySQLTLSCA, Config.MySQLTLSCert and Config.MySQLTLSKey (tls=preferred uses TLS only where offered)")
	case strings.Contains(err.Error(), "remote error: tls:"):
		// The server's alert: it refused our certificate (or lack of one).
		return te(fmt.Sprintf("the server at %s refused the TLS handshake (%s)", addr, remoteAlert(err)),
			"check that Config.MySQLTLSCert is signed by the CA the server trusts (its ssl-ca) and matches Config.MySQLTLSKey")
	}
	return nil
}

// remoteAlert extracts "remote error: tls: ..." from err's message.
func remoteAlert(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "remote error: tls:"); i >= 0 {
		return msg[i:]
	}
	return msg
}
