package relay

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/streams"
)

// A library user who sets only the stream's name and partitions gets what
// the CLI gives: the producers named after the relay, the lanes' window,
// the URL, password file and TLS files of the AMQP broker.
func TestUnitStreamDefaultsFollowTheRestOfTheConfig(t *testing.T) {
	cfg := Config{
		MySQLDSN: "u:p@tcp(db:3306)/app", AMQPURL: "amqps://relay@rabbit.example:5671/v", RelayName: "orders",
		ConfirmWindow: 64, Stream: streams.Config{Stream: "events", Partitions: 4},
	}
	cfg.AMQPOptions.PasswordFile, cfg.AMQPOptions.TLSCA = "/run/secrets/amqp", "/etc/ca.pem"
	cfg.SetDefaults()
	s := cfg.Stream
	want := streams.Config{
		Stream: "events", Partitions: 4, URL: "rabbitmq-stream+tls://relay@rabbit.example:5551/v", Producer: "orders",
		Window: 64, ConfirmTimeout: streams.DefaultConfirmTimeout, PasswordFile: "/run/secrets/amqp",
	}
	want.TLS.TLSCA = "/etc/ca.pem"
	if s != want {
		t.Fatalf("stream destination after SetDefaults:\n got %+v\nwant %+v", s, want)
	}
	// Set fields are kept.
	cfg = Config{AMQPURL: "amqp://g:g@h:5672/", Stream: streams.Config{Stream: "e", Partitions: 1, URL: "rabbitmq-stream://a:b@s:5552/", Producer: "p", Window: 7}}
	cfg.SetDefaults()
	if s := cfg.Stream; s.URL != "rabbitmq-stream://a:b@s:5552/" || s.Producer != "p" || s.Window != 7 || s.PasswordFile != "" {
		t.Fatalf("set fields changed: %+v", s)
	}
	// Off: untouched.
	cfg = Config{AMQPURL: "amqp://g:g@h:5672/"}
	cfg.SetDefaults()
	if cfg.Stream != (streams.Config{}) {
		t.Fatalf("stream destination off, yet filled: %+v", cfg.Stream)
	}
}
