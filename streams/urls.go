package streams

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// URLs is Config.URL split at its commas, each trimmed: one URL (a single
// node, or a load balancer in front of a cluster), or every node of a
// cluster.
func (c Config) URLs() []string {
	parts := strings.Split(c.URL, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

// checkURLs checks each URL of the list; errors name --stream-url.
func (c Config) checkURLs() error {
	urls := c.URLs()
	tlsCount := 0
	for i, u := range urls {
		form := "the form is rabbitmq-stream://user:pass@host:5552/vhost (rabbitmq-stream+tls:// for TLS), several nodes separated by commas"
		if u == "" {
			return fmt.Errorf("--stream-url %s: URL %d of %d is empty; %s", redact.URL(c.URL), i+1, len(urls), form)
		}
		p, err := url.Parse(u)
		if err != nil || !strings.HasPrefix(u, "rabbitmq-stream") || p.Hostname() == "" {
			return fmt.Errorf("--stream-url %s: %s", redact.URL(u), form)
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

// dialURLs are the URLs the client dials: URLs with PasswordFile's
// password. Errors name the file, never the password.
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
			return nil, fmt.Errorf("--stream-url %s does not parse", redact.URL(raw))
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

// probeTimeout bounds firstReachable's dial of each URL.
const probeTimeout = 3 * time.Second

// firstReachable is the index of the first URL whose host:port accepts a
// TCP connection (0 when none does: the client's own dial then reports
// the error).
func firstReachable(urls []string) int {
	for i, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			continue
		}
		port := u.Port()
		if port == "" {
			port = strconv.Itoa(DefaultPort)
		}
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(u.Hostname(), port), probeTimeout)
		if err == nil {
			_ = conn.Close()
			return i
		}
	}
	return 0
}
