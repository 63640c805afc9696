package main

import (
	"strings"
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

// The stream connection derived from an amqps:// --amqp-url uses the AMQP
// connection's TLS files (finding E); a plain one does not.
func TestUnitStreamConfigTakesTheTLSFiles(t *testing.T) {
	for _, c := range []struct {
		name, amqp string
		tls        bool
	}{
		{"amqps", "amqps://relay:x@rabbit.example:5671/", true},
		{"amqp", "amqp://relay:x@rabbit.example:5672/", false},
	} {
		cfg := relay.Config{AMQPURL: c.amqp, RelayName: "r", Stream: streams.Config{Stream: "s", Partitions: 1}}
		cfg.AMQPOptions.TLSCA = "/etc/ca.pem"
		if c.tls {
			// The CA file does not exist: refused, naming it.
			if err := streamConfig(&cfg); err == nil || !strings.Contains(err.Error(), "/etc/ca.pem") {
				t.Fatalf("%s: %v, want the missing CA file named", c.name, err)
			}
		} else if err := streamConfig(&cfg); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := cfg.Stream.TLS.TLSCA == "/etc/ca.pem"; got != c.tls {
			t.Errorf("%s: stream TLS CA %q", c.name, cfg.Stream.TLS.TLSCA)
		}
	}
}
