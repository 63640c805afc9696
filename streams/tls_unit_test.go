package streams

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Finding E: a rabbitmq-stream+tls:// URL (derived from amqps://) dials
// with the broker's name set from the URL's host (the client sets none, so
// every handshake failed), the CA of --amqp-tls-ca and the client
// certificate of --amqp-tls-cert, which logs in (EXTERNAL) when there is
// no password; a plain URL gets no TLS.
func TestUnitStreamTLSConfig(t *testing.T) {
	ca := testenv.NewCA(t)
	certFile, keyFile := ca.IssueFiles(t, "relay")
	base := Config{Stream: "s", Partitions: 1, Producer: "d", Window: 1}

	plain := base
	plain.URL = "rabbitmq-stream://u:p@rabbit.example:5552/"
	plain.TLS = publish.ConnOptions{TLSCA: ca.CertFile}
	if tc, _, err := plain.tlsConfig(); err != nil || tc != nil {
		t.Fatalf("plain URL: TLS %v, %v", tc, err)
	}

	c := base
	c.URL = "rabbitmq-stream+tls://u:p@rabbit.example:5551/"
	tc, external, err := c.tlsConfig()
	if err != nil || tc == nil || tc.ServerName != "rabbit.example" || tc.RootCAs != nil || external {
		t.Fatalf("TLS without files: %+v, external %v, %v; want ServerName rabbit.example, the system's roots", tc, external, err)
	}

	c.TLS = publish.ConnOptions{TLSCA: ca.CertFile, TLSCert: certFile, TLSKey: keyFile}
	tc, external, err = c.tlsConfig()
	if err != nil || tc.ServerName != "rabbit.example" || tc.RootCAs == nil || len(tc.Certificates) != 1 || external {
		t.Fatalf("TLS with files: %+v, external %v, %v", tc, external, err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}

	c.URL = "rabbitmq-stream+tls://relay@rabbit.example:5551/" // no password: the certificate logs in
	if _, external, err = c.tlsConfig(); err != nil || !external {
		t.Fatalf("client certificate without a password: external %v, %v", external, err)
	}

	c.TLS = publish.ConnOptions{TLSCA: certFile + ".missing"}
	if err := c.Validate(); err == nil {
		t.Fatal("a CA file that does not exist was accepted")
	}
}
