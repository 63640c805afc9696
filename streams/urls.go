package streams

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// nextURL is a comma that starts another URL of the list: one followed by
// a scheme and "://". A comma elsewhere (in a password) belongs to its URL.
var nextURL = regexp.MustCompile(`,\s*[A-Za-z][A-Za-z0-9+.\-]*://`)

// URLs is Config.URL split at the commas that start another URL (nextURL),
// each trimmed: one URL (a single node, or a load balancer in front of a
// cluster), or every node of a cluster.
func (c Config) URLs() []string {
	var urls []string
	begin := 0
	for _, m := range nextURL.FindAllStringIndex(c.URL, -1) {
		urls = append(urls, strings.TrimSpace(c.URL[begin:m[0]]))
		begin = m[0] + 1
	}
	return append(urls, strings.TrimSpace(c.URL[begin:]))
}

// checkURLs checks each URL of the list; errors name --stream-url and show
// the list with its passwords masked.
func (c Config) checkURLs() error {
	const form = "the form is rabbitmq-stream://user:pass@host:5552/vhost (rabbitmq-stream+tls:// for TLS), several nodes separated by commas"
	urls := c.URLs()
	tlsCount := 0
	for i, u := range urls {
		if u == "" || strings.HasSuffix(u, ",") || strings.HasPrefix(u, ",") {
			return fmt.Errorf("--stream-url %s: an empty URL (two commas in a row, or a comma at an end); %s", redact.URL(c.URL), form)
		}
		p, err := url.Parse(u)
		if err != nil || !strings.HasPrefix(u, "rabbitmq-stream") || p.Hostname() == "" {
			return fmt.Errorf("--stream-url %s: URL %d of %d: %s", redact.URL(c.URL), i+1, len(urls), form)
		}
		if strings.HasPrefix(u, "rabbitmq-stream+tls://") {
			tlsCount++
		}
	}
	if tlsCount != 0 && tlsCount != len(urls) {
		return fmt.Errorf("--stream-url %s: either every URL is rabbitmq-stream+tls:// or none", redact.URL(c.URL))
	}
	return nil
}

// HasPassword reports whether any URL of the list names a password.
func (c Config) HasPassword() bool {
	for _, u := range c.URLs() {
		if p, err := url.Parse(u); err == nil {
			if _, has := p.User.Password(); has {
				return true
			}
		}
	}
	return false
}

// hosts is the host of each URL of the list.
func (c Config) hosts() []string {
	var hosts []string
	for _, u := range c.URLs() {
		if p, err := url.Parse(u); err == nil {
			hosts = append(hosts, p.Hostname())
		}
	}
	return hosts
}

// dialURLs are the URLs the client dials: URLs, each without a password
// of its own given PasswordFile's. Errors name the file, never the
// password.
func (c Config) dialURLs() ([]string, error) {
	urls := c.URLs()
	if c.PasswordFile == "" {
		return urls, nil
	}
	pw, err := redact.ReadPasswordFile(c.PasswordFile)
	if err != nil {
		return nil, fmt.Errorf("read the stream connection's password (--amqp-password-file): %w", err)
	}
	for i, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("--stream-url %s does not parse", redact.URL(c.URL))
		}
		if _, has := u.User.Password(); has {
			continue
		}
		u.User = url.UserPassword(u.User.Username(), pw)
		urls[i] = u.String()
	}
	return urls, nil
}

// anyHostVerifier makes cfg check the broker's certificate against cfg's
// roots (the system's when nil) and any of hosts: with several URLs one TLS
// configuration serves every node, so it cannot name the one dialed.
func anyHostVerifier(cfg *tls.Config, hosts []string) {
	roots := cfg.RootCAs
	cfg.InsecureSkipVerify = true // replaced by VerifyConnection: chain and name are checked there
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the stream broker presented no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		leaf := cs.PeerCertificates[0]
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
			return fmt.Errorf("the stream broker's certificate: %w", err)
		}
		for _, h := range hosts {
			if leaf.VerifyHostname(h) == nil {
				return nil
			}
		}
		return fmt.Errorf("the stream broker's certificate is valid for none of the hosts of --stream-url (%s)", strings.Join(hosts, ", "))
	}
}

// probeTimeout bounds reachable's dial and handshake of each URL.
const probeTimeout = 3 * time.Second

// reachable dials raw's host:port and, with tc (a rabbitmq-stream+tls://
// URL), completes a TLS handshake, all within timeout: the client's own
// dial has no timeout, and its TLS handshake none either, so a node that
// accepts connections and answers nothing (a stopped process, a paused VM)
// would hold a term forever.
func reachable(raw string, tc *tls.Config, timeout time.Duration) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("the URL does not parse")
	}
	port := u.Port()
	if port == "" {
		port = strconv.Itoa(DefaultPort)
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	if tc == nil {
		return nil
	}
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if err := tls.Client(conn, tc).Handshake(); err != nil {
		return fmt.Errorf("TLS handshake with %s: %w", addr, err)
	}
	return nil
}

// firstReachable is the index of the first URL, from start on and
// wrapping around, that is reachable within timeout; an error naming each
// URL's failure (hosts and ports only) when none is.
func firstReachable(urls []string, start int, tc *tls.Config, timeout time.Duration) (int, error) {
	var errs []error
	for k := range urls {
		i := (start + k) % len(urls)
		err := reachable(urls[i], tc, timeout)
		if err == nil {
			return i, nil
		}
		errs = append(errs, fmt.Errorf("stream node %d of %d: %w", i+1, len(urls), err))
	}
	return 0, fmt.Errorf("no stream node answered within %v: %w", timeout, errors.Join(errs...))
}
