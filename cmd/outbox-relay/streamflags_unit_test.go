package main

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/streams"
)

// --amqp-password-file reaches the stream connection: whether the stream URL
// is derived from --amqp-url or given with --stream-url, a URL without a
// password gets the file (read at every dial, streams.Config.PasswordFile);
// a URL with its own password keeps it.
func TestUnitStreamConfigTakesThePasswordFile(t *testing.T) {
	for _, c := range []struct {
		name, amqp, stream, want string
	}{
		{"derived from --amqp-url", "amqp://relay@127.0.0.1:5672/", "", "/run/pw"},
		{"--stream-url without a password", "amqp://relay@127.0.0.1:5672/", "rabbitmq-stream://relay@10.0.0.2:5552/", "/run/pw"},
		{"--stream-url with its own password", "amqp://relay@127.0.0.1:5672/", "rabbitmq-stream://relay:x@10.0.0.2:5552/", ""},
	} {
		cfg := relay.Config{AMQPURL: c.amqp, RelayName: "r", Stream: streams.Config{Stream: "s", Partitions: 2, URL: c.stream}}
		cfg.AMQPOptions.PasswordFile = "/run/pw"
		if err := streamConfig(&cfg); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if cfg.Stream.PasswordFile != c.want {
			t.Errorf("%s: stream password file %q, want %q", c.name, cfg.Stream.PasswordFile, c.want)
		}
	}
}
