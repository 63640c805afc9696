package relay

import (
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// setStreamDefaults fills what the stream destination (Config.Stream, when
// enabled) leaves zero from the rest of c, as docs/operations.md states for
// the CLI: the producers are named after RelayName, each partition's window
// is ConfirmWindow, the confirmation timeout is
// streams.DefaultConfirmTimeout, and an empty URL is derived from AMQPURL,
// a stream URL per node (streams.FromAMQP). The broker is then the AMQP connection's: a URL
// without a password takes AMQPOptions.PasswordFile, and a
// rabbitmq-stream+tls:// URL without TLS files takes AMQPOptions' CA and
// client certificate. It runs after RelayName and ConfirmWindow have theirs.
func (c *Config) setStreamDefaults() {
	s := &c.Stream
	if !s.Enabled() {
		return
	}
	setDefault(&s.Producer, c.RelayName)
	setDefault(&s.Window, c.ConfirmWindow)
	setDefault(&s.ConfirmTimeout, streams.DefaultConfirmTimeout)
	if s.URL == "" {
		// An AMQP URL that does not parse leaves it empty; Validate
		// reports the AMQP URL first.
		s.URL, _ = streams.FromAMQP(c.AMQPURL)
	}
	if s.PasswordFile == "" && !s.HasPassword() {
		s.PasswordFile = c.AMQPOptions.PasswordFile // read at every dial, as the AMQP connection's
	}
	if s.IsTLS() && s.TLS == (publish.ConnOptions{}) {
		o := c.AMQPOptions
		s.TLS = publish.ConnOptions{TLSCA: o.TLSCA, TLSCert: o.TLSCert, TLSKey: o.TLSKey}
	}
}
