package main

import (
	"fmt"
	"net/url"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/streams"
)

// streamConfig completes the stream destination of cfg from the other
// flags: the producers are named after the relay name, each partition's
// window is --confirm-window, the URL comes from --amqp-url when
// --stream-url is empty (with --amqp-password-file's password), and
// validates it (exit 2 naming the flag).
func streamConfig(cfg *relay.Config) error {
	s := &cfg.Stream
	if !s.Enabled() {
		if err := s.Validate(); err != nil {
			return usagef("%v", err)
		}
		return nil
	}
	s.Producer = cfg.RelayName
	s.Window = cfg.ConfirmWindow
	if s.Window <= 0 {
		s.Window = relay.DefaultConfirmWindow
	}
	s.ConfirmTimeout = streams.DefaultConfirmTimeout
	if s.URL == "" {
		u, err := streams.FromAMQP(cfg.AMQPURL)
		if err != nil {
			return usagef("%v", err)
		}
		s.URL = u
	}
	if u, err := url.Parse(s.URL); err == nil {
		if _, has := u.User.Password(); !has {
			// Read at every dial, as the AMQP connection does.
			s.PasswordFile = cfg.AMQPOptions.PasswordFile
		}
	}
	if s.IsTLS() {
		// The same broker: the AMQP connection's CA and client certificate.
		o := cfg.AMQPOptions
		s.TLS = publish.ConnOptions{TLSCA: o.TLSCA, TLSCert: o.TLSCert, TLSKey: o.TLSKey}
	}
	if err := s.Validate(); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// declareStreams is run's topology step: with --stream and
// --stream-declare it declares the partition streams that do not exist
// (and the super stream where the broker and client can), before the relay
// starts.
func declareStreams(cfg streams.Config, declare bool, log *zap.Logger) error {
	if !cfg.Enabled() || !declare {
		return nil
	}
	pub, err := streams.Dial(cfg)
	if err != nil {
		return fmt.Errorf("declare the partition streams of %s: %w", cfg.Stream, err)
	}
	defer pub.Close()
	super, err := pub.Declare()
	if err != nil {
		return err
	}
	log.Info("stream destination declared", zap.String("stream", cfg.Stream), zap.Int("partitions", cfg.Partitions),
		zap.Bool("super_stream", super))
	return nil
}
