package streams

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// --stream-url takes a cluster's nodes separated by commas, and is derived
// from every --amqp-url node when empty; a list that mixes TLS and plain
// URLs, or holds an empty one, is refused naming the flag.
func TestUnitStreamURLList(t *testing.T) {
	got, err := FromAMQP("amqp://u:p@n1:5672/v, amqp://u:p@n2:5673/v")
	if want := "rabbitmq-stream://u:p@n1:5552/v,rabbitmq-stream://u:p@n2:5552/v"; err != nil || got != want {
		t.Fatalf("FromAMQP of two nodes: %q, %v; want %q", got, err, want)
	}
	if got, _ := FromAMQP("amqp://u:p@h:5672/,amqp://u:p@h:5673/"); got != "rabbitmq-stream://u:p@h:5552/" {
		t.Errorf("FromAMQP of two nodes on one host: %q, want one stream URL", got)
	}
	base := Config{Stream: "s", Partitions: 1, Producer: "d", Window: 1}
	if got := (Config{URL: "rabbitmq-stream://relay:123,secret@n1:5552/v , rabbitmq-stream://relay:x@n2:5552/v"}).URLs(); len(got) != 2 ||
		got[0] != "rabbitmq-stream://relay:123,secret@n1:5552/v" || got[1] != "rabbitmq-stream://relay:x@n2:5552/v" {
		t.Errorf("URLs of a list whose first password holds a comma: %q", got)
	}
	for _, c := range []struct {
		url, bad string // bad: what the error must say ("" when valid)
	}{
		{"rabbitmq-stream://u:p@n1:5552/, rabbitmq-stream://u:p@n2:5552/", ""},
		{"rabbitmq-stream://u:p@n1:5552/,,rabbitmq-stream://u:p@n2:5552/", "an empty URL"},
		{"rabbitmq-stream://u:p@n1:5552/,", "an empty URL"},
		// A comma in a password is the password's, not a second URL.
		{"rabbitmq-stream://relay:123,secretpart@n1:5552/v", ""},
		{"rabbitmq-stream://u:p@n1:5552/,rabbitmq-stream+tls://u:p@n2:5551/", "either every URL"},
		{"rabbitmq-stream://u:p@n1:5552/,amqp://u:p@n2:5672/", "URL 2 of 2"},
		{"rabbitmq-stream://u:123,secretpart@n1:5552/,amqp://u:p@n2:5672/", "URL 2 of 2"},
	} {
		cfg := base
		cfg.URL = c.url
		err := cfg.Validate()
		if (c.bad == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.bad)) {
			t.Errorf("%s: %v, want %q", c.url, err, c.bad)
		}
		if err != nil && (strings.Contains(err.Error(), ":p@") || strings.Contains(err.Error(), "secretpart")) {
			t.Errorf("%s: the error shows a password: %v", c.url, err)
		}
	}
}

// With several TLS URLs one TLS configuration serves every node: the
// broker's certificate must chain to the CA and name one of the URLs' hosts.
func TestUnitStreamTLSAcrossNodes(t *testing.T) {
	ca := testenv.NewCA(t)
	nodeCert := ca.Issue(t, "node-2.example")
	cfg := Config{Stream: "s", Partitions: 1, Producer: "d", Window: 1, TLS: publish.ConnOptions{TLSCA: ca.CertFile},
		URL: "rabbitmq-stream+tls://u:p@node-1.example:5551/,rabbitmq-stream+tls://u:p@node-2.example:5551/"}
	handshake := func(cfg Config, serverCert tls.Certificate) error {
		tc, _, err := cfg.tlsConfig()
		if err != nil {
			t.Fatal(err)
		}
		// Loopback TCP, not net.Pipe: a refused certificate's alert must
		// not wait on the server's unread flight.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() { // ends with the client's handshake: the client closes its end
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
			_ = tls.Server(conn, &tls.Config{Certificates: []tls.Certificate{serverCert}}).Handshake()
		}()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return tls.Client(conn, tc).Handshake()
	}
	if err := handshake(cfg, nodeCert.TLS); err != nil {
		t.Fatalf("a node named in the list: %v", err)
	}
	cfg.URL = "rabbitmq-stream+tls://u:p@node-1.example:5551/,rabbitmq-stream+tls://u:p@node-3.example:5551/"
	if err := handshake(cfg, nodeCert.TLS); err == nil || !strings.Contains(err.Error(), "none of the hosts") {
		t.Fatalf("a certificate for a host not in the list: %v", err)
	}
	other := testenv.NewCA(t).Issue(t, "node-2.example")
	cfg.URL = "rabbitmq-stream+tls://u:p@node-1.example:5551/,rabbitmq-stream+tls://u:p@node-2.example:5551/"
	if err := handshake(cfg, other.TLS); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a certificate of another CA: %v", err)
	}
}

// A node that accepts connections and answers nothing (a stopped process)
// is skipped within the probe's timeout, over TLS where the client's own
// handshake has no deadline; with every node so, the error names each.
func TestUnitFirstReachableSkipsASilentNode(t *testing.T) {
	ca := testenv.NewCA(t)
	cert := ca.Issue(t, "127.0.0.1")
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() { // ends when silent closes, and closes what it accepted (never answered)
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	good, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert.TLS}})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	go func() { // ends when good closes
		for {
			c, err := good.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	cfg := Config{TLS: publish.ConnOptions{TLSCA: ca.CertFile},
		URL: "rabbitmq-stream+tls://u:p@" + silent.Addr().String() + "/,rabbitmq-stream+tls://u:p@" + good.Addr().String() + "/"}
	tc, _, err := cfg.tlsConfig()
	if err != nil {
		t.Fatal(err)
	}
	if i, err := firstReachable(cfg.URLs(), 0, tc, 200*time.Millisecond); err != nil || i != 1 {
		t.Fatalf("first reachable: %d, %v; want the answering node (1)", i, err)
	}
	_, err = firstReachable(cfg.URLs()[:1], 0, tc, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "stream node 1 of 1") || strings.Contains(err.Error(), ":p@") {
		t.Fatalf("only the silent node: %v; want an error naming it, without the password", err)
	}
}
