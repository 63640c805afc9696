package testenv_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// One private node, with a TLS listener (RabbitTLS), is checked for all
// the harness promises of StartRabbitMQ: a node starts beside the shared
// broker without disturbing it (both answer at once); it serves AMQP over TLS
// to clients that verify it; it serves plain AMQP on a port of its own. One
// node for all: each start of a RabbitMQ node costs seconds of both cores.
func TestRabbitNode(t *testing.T) {
	t.Parallel()
	ca := testenv.NewCA(t)
	began := time.Now()
	n := testenv.StartRabbitMQ(t, testenv.RabbitTLS(ca))
	t.Logf("node %s on %s up in %v", n.Name(), n.Addr(), time.Since(began).Round(time.Millisecond))
	t.Run("beside_shared_broker", func(t *testing.T) { testRabbitNodeBesideSharedBroker(t, n) })
	t.Run("tls", func(t *testing.T) { testRabbitNodeTLS(t, n, ca) })
	t.Run("own_port", func(t *testing.T) { testRabbitNodeOwnPort(t, n) })
}

// The node serves plain AMQP as guest on a port of its own and confirms a
// persistent message into its broker's queue. That it goes away on Stop and
// comes back on Start with its durable queues and messages is what the
// broker-outage tests stand on (relay: TestRelaySurvivesBrokerRestart, the
// cluster's faults): each restart costs seconds of both cores, so it is not
// tested twice.
func testRabbitNodeOwnPort(t *testing.T, n *testenv.RabbitNode) {
	if !strings.HasPrefix(n.URL(), "amqp://guest:guest@127.0.0.1:") || strings.HasSuffix(n.URL(), ":5672/") {
		t.Fatalf("URL %q: want guest on 127.0.0.1 on a port of its own", n.URL())
	}
	b := n.Broker(t)
	if b.URL != n.URL() {
		t.Fatalf("broker URL %q, node URL %q", b.URL, n.URL())
	}
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm(b.Exchange, "a.b", true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, MessageId: "kept", Body: []byte("kept"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx(t)); err != nil || !ok {
		t.Fatalf("publish not confirmed: ack %v, %v", ok, err)
	}
	msg, ok, err := ch.Get(b.Queue, true)
	if err != nil || !ok || msg.MessageId != "kept" {
		t.Fatalf("get from %s: ok %v, %v, message %q", b.Queue, ok, err, msg.MessageId)
	}
}

// The node does not disturb the shared broker: both answer at once.
func testRabbitNodeBesideSharedBroker(t *testing.T, n *testenv.RabbitNode) {
	shared := testenv.RabbitMQ(t)
	for _, url := range []string{shared.URL, n.URL()} {
		c, err := amqp.Dial(url)
		if err != nil {
			t.Fatalf("dial %s: %v", url, err)
		}
		c.Close()
	}
}

// A node with RabbitTLS serves AMQP over TLS to a client that verifies it
// with the CA and presents a certificate of the same CA: as guest with a
// password (PLAIN), and as the certificate's common name without one
// (EXTERNAL). A client without a certificate is refused; the plain listener
// still works.
func testRabbitNodeTLS(t *testing.T, n *testenv.RabbitNode, ca *testenv.CA) {
	if !strings.HasPrefix(n.AMQPSURL(), "amqps://guest:guest@localhost:") {
		t.Fatalf("AMQPSURL %q", n.AMQPSURL())
	}
	roots := x509.NewCertPool()
	pemCA, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	if !roots.AppendCertsFromPEM(pemCA) {
		t.Fatalf("%s holds no certificate", ca.CertFile)
	}
	certFile, keyFile := ca.IssueFiles(t, "tls-client")
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(url string, certs []tls.Certificate, sasl []amqp.Authentication) error {
		c, err := amqp.DialConfig(url, amqp.Config{
			TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs},
			SASL:            sasl,
		})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(n.AMQPSURL(), []tls.Certificate{pair}, nil); err != nil {
		t.Errorf("PLAIN over TLS with a client certificate: %v", err)
	}
	n.AddUser(t, "tls-client", "")
	if err := dial(n.AMQPSURL(), []tls.Certificate{pair}, []amqp.Authentication{&amqp.ExternalAuth{}}); err != nil {
		t.Errorf("EXTERNAL as the certificate's common name: %v", err)
	}
	if err := dial(n.AMQPSURL(), nil, nil); err == nil {
		t.Error("a client without a certificate was let in")
	}
	if err := dial(n.URL(), nil, nil); err != nil {
		t.Errorf("the plain listener: %v", err)
	}
}
