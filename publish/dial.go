package publish

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// ConnOptions is what an AMQP connection needs besides its URL: TLS files
// and a password file. The zero value adds nothing to the URL. When the URL
// is a comma-separated list (the nodes of a cluster), the options hold for
// every URL of it: one CA, one client certificate, one password file.
//
// Files are read at every dial, reconnects included: a rotated password,
// client certificate or CA takes effect at the next connection, without a
// restart.
type ConnOptions struct {
	// TLSCA (--amqp-tls-ca) is a PEM file of the CA certificates the
	// broker's certificate must chain to; empty: the system's roots.
	TLSCA string
	// TLSCert and TLSKey (--amqp-tls-cert, --amqp-tls-key) are the PEM
	// files of a client certificate and its key, given together. With a
	// client certificate and no password (neither in the URL nor in
	// PasswordFile) the connection logs in with SASL EXTERNAL: the broker
	// takes the user from the certificate, and a user name in the URL is
	// ignored.
	TLSCert, TLSKey string
	// PasswordFile (--amqp-password-file) holds the password of the URL's
	// user, which the URL must then name without a password. Trailing line
	// breaks (\n, \r\n) are stripped.
	PasswordFile string
}

func (o ConnOptions) tlsGiven() bool { return o.TLSCA != "" || o.TLSCert != "" || o.TLSKey != "" }

// external reports whether a connection to a URL with (hasPassword) or
// without a password logs in with EXTERNAL.
func (o ConnOptions) external(hasPassword bool) bool {
	return o.TLSCert != "" && !hasPassword && o.PasswordFile == ""
}

// Check refuses options that cannot work with rawURL (one URL or a
// comma-separated list): TLS files for an amqp:// URL, a certificate
// without its key or a key without its certificate, a password both in the
// URL and in a file, a password file for a URL without a user name, TLS
// parameters both in the URL and in the options. It reads the files once, so
// that a missing or malformed file is reported now, not at the first dial.
// Errors name the option and the file, never a password or a file's content.
func (o ConnOptions) Check(rawURL string) error {
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return errors.New("a client certificate needs both ConnOptions.TLSCert and ConnOptions.TLSKey")
	}
	for _, one := range strings.Split(rawURL, ",") {
		if err := o.checkURL(strings.TrimSpace(one)); err != nil {
			return err
		}
	}
	if _, err := o.tlsConfig(); err != nil {
		return err
	}
	if o.PasswordFile != "" {
		if _, err := o.password(); err != nil {
			return err
		}
	}
	return nil
}

func (o ConnOptions) checkURL(raw string) error {
	uri, err := amqp.ParseURI(raw)
	if err != nil {
		return fmt.Errorf("Config.URL %s does not parse (the form is amqp://user:pass@host:5672/vhost, amqps:// for TLS)", redact.URL(raw))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("Config.URL %s does not parse", redact.URL(raw))
	}
	if o.tlsGiven() && uri.Scheme != "amqps" {
		return fmt.Errorf("ConnOptions.TLSCA, ConnOptions.TLSCert and ConnOptions.TLSKey are for TLS, but Config.URL %s is amqp://: use amqps:// and the broker's TLS port (5671 by default)", redact.URL(raw))
	}
	if o.tlsGiven() && (uri.CACertFile != "" || uri.CertFile != "" || uri.KeyFile != "") {
		return fmt.Errorf("Config.URL %s has TLS parameters (cacertfile, certfile, keyfile) and ConnOptions.TLSCA, ConnOptions.TLSCert or ConnOptions.TLSKey are given too: use one or the other", redact.URL(raw))
	}
	if o.PasswordFile != "" {
		if _, has := u.User.Password(); has {
			return fmt.Errorf("Config.URL %s has a password and ConnOptions.PasswordFile %s is given too: remove the password from the URL", redact.URL(raw), o.PasswordFile)
		}
		if u.User.Username() == "" {
			return fmt.Errorf("ConnOptions.PasswordFile %s is given but Config.URL %s names no user: put the user in the URL, amqp://USER@host:5672/vhost", o.PasswordFile, redact.URL(raw))
		}
	}
	return nil
}

// password reads PasswordFile.
func (o ConnOptions) password() (string, error) {
	pw, err := redact.ReadPasswordFile(o.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("ConnOptions.PasswordFile: %w", err)
	}
	return pw, nil
}

// TLSConfig is the TLS client configuration of the TLS files, read now
// (nil when none is given), for another connection to the same broker (the
// stream protocol's).
func (o ConnOptions) TLSConfig() (*tls.Config, error) { return o.tlsConfig() }

// tlsConfig builds the TLS client configuration from the files; nil when no
// TLS option is given (amqp091 then uses the URL's TLS parameters, or the
// system's roots).
func (o ConnOptions) tlsConfig() (*tls.Config, error) {
	if !o.tlsGiven() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.TLSCA != "" {
		data, err := os.ReadFile(o.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("read ConnOptions.TLSCA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("ConnOptions.TLSCA %s holds no PEM certificate: give the CA certificate that signed the broker's, in PEM (-----BEGIN CERTIFICATE-----)", o.TLSCA)
		}
		cfg.RootCAs = pool
	}
	if o.TLSCert != "" {
		pair, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("load the client certificate ConnOptions.TLSCert %s with its key ConnOptions.TLSKey %s (PEM files, the key unencrypted): %w", o.TLSCert, o.TLSKey, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// Dial opens an AMQP connection to rawURL (one URL) with o, reading o's
// files now. ctx bounds the TCP connect; the connect and the handshake take
// at most dialTimeout. name is the connection name the broker shows. Errors
// name the broker (password masked), the cause and the fix; IsRefused tells
// a configuration problem from an unreachable broker. A list of URLs (a
// cluster's nodes, SplitURLs) is refused without dialling: dialled as one
// URL, the rest of the list would reach the broker as the vhost, which it
// quotes back, credentials included, in its refusal. DialAny takes a list.
func Dial(ctx context.Context, rawURL string, o ConnOptions, name string) (*amqp.Connection, error) {
	if urls, err := SplitURLs(rawURL); err == nil && len(urls) > 1 {
		return nil, &dialError{msg: "connect to AMQP broker " + redact.URL(rawURL), refused: true,
			err: fmt.Errorf("a list of %d URLs where one URL is expected: dial the nodes one at a time (publish.DialAny)", len(urls))}
	}
	return dial(ctx, rawURL, o, name, nil)
}

// DialAny opens an AMQP connection to the first of rawURLs (one URL, or a
// cluster's nodes separated by commas: SplitURLs) that answers, dialling
// them in order as Dial does, and returns it with the node (host:port) it
// reached. When none answers it returns the first refusal (IsRefused) if
// any node refused, else the last node's error; no error holds a password.
func DialAny(ctx context.Context, rawURLs string, o ConnOptions, name string) (*amqp.Connection, string, error) {
	urls, err := SplitURLs(rawURLs)
	if err != nil {
		return nil, "", &dialError{msg: "connect to AMQP broker", refused: true, err: err}
	}
	var refused error
	for _, u := range urls {
		conn, derr := dial(ctx, u, o, name, nil)
		if derr == nil {
			return conn, nodeOf(u), nil
		}
		if IsRefused(derr) && refused == nil {
			refused = derr
		}
		err = derr
	}
	if refused != nil {
		return nil, "", refused
	}
	return nil, "", err
}

// dial is Dial with wrap, when set, around the TCP connection (under TLS).
func dial(ctx context.Context, rawURL string, o ConnOptions, name string, wrap func(net.Conn) net.Conn) (*amqp.Connection, error) {
	cfg, external, err := o.amqpConfig(rawURL)
	if err != nil {
		return nil, &dialError{msg: "connect to AMQP broker " + redact.URL(rawURL), err: err}
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	cfg.Properties = props
	// Set when the server's first bytes are a TLS record, for an amqp://
	// URL: it is a TLS port.
	var sniffed *sniffConn
	uri, _ := amqp.ParseURI(rawURL) // amqpConfig parsed it
	plain := uri.Scheme == "amqp"
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		// Unlike amqp.DefaultDial this honours ctx, so a caller that stops
		// does not wait out a connect to a silent host.
		d := net.Dialer{Timeout: dialTimeout}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := conn.SetDeadline(time.Now().Add(dialTimeout)); err != nil {
			conn.Close()
			return nil, err
		}
		if plain {
			sniffed = &sniffConn{Conn: conn}
			conn = sniffed
		}
		if wrap != nil {
			conn = wrap(conn)
		}
		return conn, nil
	}
	// Whether the broker asked for a client certificate we do not have: in
	// TLS 1.3 its refusal comes after our side of the handshake, and a busy
	// broker may close the socket before its alert is read (an EOF).
	asked := new(atomic.Bool)
	if tc := cfg.TLSClientConfig; tc != nil && len(tc.Certificates) == 0 && tc.GetClientCertificate == nil {
		tc = tc.Clone()
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			asked.Store(true)
			return &tls.Certificate{}, nil // none: the broker decides
		}
		cfg.TLSClientConfig = tc
	}
	conn, err := amqp.DialConfig(rawURL, cfg)
	if err != nil {
		return nil, explainDialError(rawURL, o, external, sniffed != nil && sniffed.tls.Load(), asked.Load(), err)
	}
	return conn, nil
}

// amqpConfig turns o into amqp091's configuration for rawURL: TLS files,
// the password from its file, EXTERNAL.
func (o ConnOptions) amqpConfig(rawURL string) (cfg amqp.Config, external bool, err error) {
	if err := o.checkURL(rawURL); err != nil {
		return cfg, false, err
	}
	if cfg.TLSClientConfig, err = o.tlsConfig(); err != nil {
		return cfg, false, err
	}
	u, _ := url.Parse(rawURL) // checkURL parsed it
	_, hasPassword := u.User.Password()
	switch {
	case o.PasswordFile != "":
		pw, err := o.password()
		if err != nil {
			return cfg, false, err
		}
		cfg.SASL = []amqp.Authentication{&amqp.PlainAuth{Username: u.User.Username(), Password: pw}}
	case o.external(hasPassword):
		cfg.SASL = []amqp.Authentication{&amqp.ExternalAuth{}}
		external = true
	}
	return cfg, external, nil
}

// sniffConn notes whether the first two bytes the server sends are the
// start of a TLS record (an alert or a handshake, version 3.x): an amqp://
// client talking to a TLS port gets such an answer where it expects AMQP.
type sniffConn struct {
	net.Conn
	head [2]byte
	seen int         // bytes of head filled; only the reading goroutine uses it
	tls  atomic.Bool // read by the dialling goroutine after the dial failed
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.seen < len(c.head) {
		c.seen += copy(c.head[c.seen:], p[:n])
		if c.seen == len(c.head) && (c.head[0] == 0x15 || c.head[0] == 0x16) && c.head[1] == 0x03 {
			c.tls.Store(true)
		}
	}
	return n, err
}

// dialError is a failed dial explained: what was dialled (password masked),
// the cause in words and the fix, then the client library's error.
type dialError struct {
	msg     string
	refused bool // configuration: retrying without a change cannot help
	err     error
}

func (e *dialError) Error() string { return e.msg + ": " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// IsRefused reports whether err, from Dial or New, is a refusal that
// retrying without a change cannot fix: the broker refused the user, the
// password or the vhost (ACCESS_REFUSED, NOT_ALLOWED), or TLS failed (a
// certificate not verified either way, TLS on one side only). Otherwise the
// broker could not be reached, or the connection broke.
func IsRefused(err error) bool {
	var de *dialError
	return errors.As(err, &de) && de.refused
}

// explainDialError names the broker and, where it can tell, the cause and
// the fix. sawTLS: the server answered an amqp:// client in TLS; askedCert:
// the broker asked for a client certificate and we had none.
func explainDialError(rawURL string, o ConnOptions, external, sawTLS, askedCert bool, err error) error {
	at := "connect to AMQP broker " + redact.URL(rawURL)
	refused := func(format string, a ...any) error {
		return &dialError{msg: at + ": " + fmt.Sprintf(format, a...), refused: true, err: err}
	}
	if msg := tlsCause(rawURL, o, sawTLS, err); msg != "" {
		return refused("%s", msg)
	}
	if askedCert && closedEarly(err) {
		return refused("TLS: the broker asked for a client certificate and none was given, then closed the connection: give ConnOptions.TLSCert and ConnOptions.TLSKey")
	}
	var ae *amqp.Error
	switch {
	case external && errors.Is(err, amqp.ErrSASL):
		return refused("the broker does not offer EXTERNAL (log in with the client certificate): enable the rabbitmq_auth_mechanism_ssl plugin and add EXTERNAL to auth_mechanisms, or give a password")
	case external && errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
		return refused("ACCESS_REFUSED for the client certificate (EXTERNAL): the broker needs a user named after the certificate (its subject DN, or its common name with ssl_cert_login_from = common_name) with permissions on the vhost")
	case errors.As(err, &ae) && ae.Code == amqp.NotAllowed:
		return refused("the vhost is refused (NOT_ALLOWED): check that it exists and the user may use it")
	case errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
		// RabbitMQ 3.10 drops the socket after a failed login, which
		// amqp091 reports as ErrCredentials (403, Server false); a socket
		// cut right after start-ok looks the same, a rare misdiagnosis.
		return refused("ACCESS_REFUSED, check the user, password and vhost")
	}
	return &dialError{msg: at, err: err}
}

// tlsCause explains a TLS failure, "" when err is none.
func tlsCause(rawURL string, o ConnOptions, sawTLS bool, err error) string {
	host := rawURL
	if uri, perr := amqp.ParseURI(rawURL); perr == nil {
		host = uri.Host
	}
	ca := "the system's CA certificates (give the broker's CA with ConnOptions.TLSCA)"
	if o.TLSCA != "" {
		ca = "ConnOptions.TLSCA " + o.TLSCA + ": give the CA that signed the broker's certificate"
	}
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		record    tls.RecordHeaderError
		ae        *amqp.Error
	)
	switch {
	case sawTLS:
		return "TLS: the broker answered in TLS, this port is a TLS listener: use amqps:// (with ConnOptions.TLSCA for a private CA)"
	case errors.As(err, &record):
		return "TLS: the broker did not answer in TLS, this port speaks plain AMQP: use amqp://, or the broker's TLS port (5671 by default) with amqps://"
	case errors.As(err, &unknownCA):
		return "TLS: the broker's certificate is not signed by a CA in " + ca
	case errors.As(err, &hostname):
		return fmt.Sprintf("TLS: the broker's certificate does not name the host %s of Config.URL: use a host name the certificate holds, or give the broker a certificate for %s", host, host)
	case errors.As(err, &invalid):
		return "TLS: the broker's certificate is not valid (expired, not yet valid, or not for a server): renew it"
	case errors.As(err, &ae) && strings.Contains(ae.Reason, "tls: "):
		// A TLS alert from the broker after our side of the handshake: it
		// did not accept our client certificate (or has none of our TLS
		// versions and ciphers).
		if o.TLSCert == "" {
			return "TLS: the broker refused the handshake (" + ae.Reason + "): it probably wants a client certificate, give ConnOptions.TLSCert and ConnOptions.TLSKey"
		}
		return "TLS: the broker refused the handshake (" + ae.Reason + "): check that ConnOptions.TLSCert " + o.TLSCert + " is signed by a CA the broker trusts (its ssl_options.cacertfile) and still valid"
	}
	var alert tls.AlertError
	if errors.As(err, &alert) {
		return "TLS: the broker refused the handshake (" + alert.Error() + "): check ConnOptions.TLSCert and ConnOptions.TLSKey, and the TLS versions the broker allows"
	}
	return ""
}

// closedEarly tells whether err is the connection closed under the
// handshake (an EOF or a reset) rather than an answer of the broker.
func closedEarly(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, amqp.ErrClosed) || strings.Contains(err.Error(), "EOF") || strings.Contains(err.Error(), "connection reset")
}
