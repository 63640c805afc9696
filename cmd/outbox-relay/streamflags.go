package main

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/streams"
)

// streamConfig completes the stream destination of cfg from the other
// flags, as relay.Config.SetDefaults does (producers named after the relay
// name, each partition's window --confirm-window, the URL from --amqp-url
// when --stream-url is empty, with --amqp-password-file's password and the
// --amqp-tls-* files), and validates it (exit 2 naming the flag).
func streamConfig(cfg *relay.Config) error {
	d := *cfg
	d.SetDefaults()
	s := d.Stream
	if s.Enabled() && s.URL == "" {
		if _, err := streams.FromAMQP(cfg.AMQPURL); err != nil {
			return usagef("%v", err)
		}
	}
	cfg.Stream = s
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
