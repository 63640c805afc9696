package streams

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Defaults of Config.
const (
	// DefaultPort is the stream protocol's port (the AMQP URL's host is
	// reused with it when Config.URL is empty).
	DefaultPort = 5552
	// DefaultConfirmTimeout is how long a message may wait for its
	// confirmation before the producer fails.
	DefaultConfirmTimeout = 30 * time.Second
	// MaxPartitions bounds Config.Partitions: one producer (and one lane)
	// per partition.
	MaxPartitions = 256
)

// Config is the stream destination.
type Config struct {
	// Stream (--stream) is the super stream's name: the partitions are
	// Stream-0 … Stream-(Partitions-1). Empty: the destination is off.
	Stream string
	// Partitions (--stream-partitions) is N, at least 1.
	Partitions int
	// URL (--stream-url) is rabbitmq-stream://user:pass@host:5552/vhost:
	// a single node or a load balancer in front of a cluster, whose
	// address every connection then goes to; or every node of a cluster,
	// separated by commas: a node that answers (each term starts at one
	// drawn at random) is asked where each partition's leader is, and each producer connects to its leader as
	// the node advertises it (the stream plugin's advertised_host and
	// advertised_port). Empty: derived from the AMQP URL (FromAMQP).
	URL string
	// Producer is the prefix of the producers' names: partition i is
	// published by "<Producer>-<i>" (the relay name).
	Producer string
	// Window is the most unconfirmed messages per partition.
	Window int
	// ConfirmTimeout is how long a message may wait for its confirmation.
	ConfirmTimeout time.Duration
	// PasswordFile (--amqp-password-file), when not empty, holds the
	// password of the URL's user; it is read at every Dial and put into the
	// URL the client dials (the client takes the credentials from the URL
	// only).
	PasswordFile string
	// TLS holds the TLS files (--amqp-tls-ca, --amqp-tls-cert,
	// --amqp-tls-key; its PasswordFile is not used) of a
	// rabbitmq-stream+tls:// URL, read at every Dial. The broker's name is
	// checked against the URL's host.
	TLS publish.ConnOptions
}

// IsTLS reports whether the URL is rabbitmq-stream+tls://.
func (c Config) IsTLS() bool { return strings.HasPrefix(c.URLs()[0], "rabbitmq-stream+tls://") }

// tlsConfig is the TLS configuration of a rabbitmq-stream+tls:// URL (nil
// for rabbitmq-stream://): TLS's CA (else the system's roots) and client
// certificate, ServerName the URL's host (the client sets none: without it
// every handshake fails); with several URLs, any of their hosts
// (anyHostVerifier). external: the client certificate logs in (SASL
// EXTERNAL), as with AMQP, when the URL has no password and there is no
// password file.
func (c Config) tlsConfig() (cfg *tls.Config, external bool, err error) {
	if !c.IsTLS() {
		return nil, false, nil
	}
	if _, err := url.Parse(c.URLs()[0]); err != nil {
		return nil, false, fmt.Errorf("--stream-url %s does not parse", redact.URL(c.URL))
	}
	cfg, err = c.TLS.TLSConfig()
	if err != nil {
		return nil, false, fmt.Errorf("TLS of the stream connection: %w", err)
	}
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if hosts := c.hosts(); len(hosts) > 1 {
		anyHostVerifier(cfg, hosts)
	} else if len(hosts) == 1 {
		cfg.ServerName = hosts[0]
	}
	return cfg, len(cfg.Certificates) > 0 && !c.HasPassword() && c.PasswordFile == "", nil
}

// Enabled reports whether a stream is configured.
func (c Config) Enabled() bool { return c.Stream != "" }

// PartitionName is the stream of partition i: "<Stream>-<i>".
func (c Config) PartitionName(i int) string { return c.Stream + "-" + strconv.Itoa(i) }

// ProducerName is the producer of partition i: "<Producer>-<i>".
func (c Config) ProducerName(i int) string { return c.Producer + "-" + strconv.Itoa(i) }

// MaxWindow bounds Config.Window: the client's queue of messages not yet
// written holds a whole window (producerOptions), at most 10000.
const MaxWindow = 10_000

// producerOptions are the client's options of producer name. Its queue
// of messages not yet written (the client sizes it by the batch size) holds
// a whole window, so that Send, which takes no context, never blocks on a
// stalled connection: at most Window messages are unconfirmed.
func (c Config) producerOptions(name string) *stream.ProducerOptions {
	opts := stream.NewProducerOptions().SetProducerName(name).SetClientProvidedName(name).
		SetBatchSize(min(MaxWindow, max(opts0BatchSize, c.Window)))
	if c.ConfirmTimeout > 0 {
		opts.SetConfirmationTimeOut(c.ConfirmTimeout)
	}
	return opts
}

// opts0BatchSize is the client's default batch size.
const opts0BatchSize = 100

// Validate checks c; the errors name the flag to fix.
func (c Config) Validate() error {
	if !c.Enabled() {
		if c.Partitions > 1 {
			return errors.New("--stream-partitions is set but --stream is not: name the super stream with --stream NAME")
		}
		return nil
	}
	if strings.TrimSpace(c.Stream) != c.Stream || len(c.Stream) > 240 {
		return fmt.Errorf("--stream %q: a stream name without surrounding spaces, at most 240 characters", c.Stream)
	}
	if c.Partitions < 1 || c.Partitions > MaxPartitions {
		return fmt.Errorf("--stream-partitions %d: between 1 and %d", c.Partitions, MaxPartitions)
	}
	if c.Producer == "" {
		return errors.New("stream destination: the producer name prefix (the relay name) is empty")
	}
	if c.Window < 1 || c.Window > MaxWindow {
		return fmt.Errorf("stream destination: confirm window %d (--confirm-window): between 1 and %d", c.Window, MaxWindow)
	}
	if err := c.checkURLs(); err != nil {
		return err
	}
	if _, _, err := c.tlsConfig(); err != nil {
		return err
	}
	return nil
}

// FromAMQP derives the stream URL from an AMQP URL, or a list of them
// (comma-separated, a cluster's nodes: a list of as many stream URLs): same
// user, password, host and vhost, port 5552 (rabbitmq-stream://), or 5551
// for amqps (rabbitmq-stream+tls://).
func FromAMQP(amqpURL string) (string, error) {
	var out []string
	for _, raw := range strings.Split(amqpURL, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("derive the stream URL from the AMQP URL %s: it does not parse; set --stream-url", redact.URL(raw))
		}
		scheme, port := "rabbitmq-stream", DefaultPort
		if u.Scheme == "amqps" {
			scheme, port = "rabbitmq-stream+tls", 5551
		}
		u.Scheme = scheme
		u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(port))
		if u.Path == "" {
			u.Path = "/"
		}
		if !slices.Contains(out, u.String()) { // nodes of one host on AMQP ports of their own
			out = append(out, u.String())
		}
	}
	return strings.Join(out, ","), nil
}
