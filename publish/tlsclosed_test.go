package publish_test

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// A broker that asks for a client certificate, gets none and closes the
// connection without a word (as a busy RabbitMQ does under TLS 1.3, its
// alert unread): New refuses at once, naming the missing certificate,
// instead of retrying for ever in the background.
func TestUnitTLSClosedAfterAskingForACertificate(t *testing.T) {
	ca := testenv.NewCA(t)
	srv := ca.Issue(t, "127.0.0.1")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{srv.TLS}, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS13,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if tc, ok := c.(*tls.Conn); ok {
				_ = tc.Handshake()
			}
			c.Close()
		}
	}()
	url := "amqps://guest:guest@" + ln.Addr().(*net.TCPAddr).String() + "/"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := publish.New(ctx, publish.Config{URL: url, Conn: publish.ConnOptions{TLSCA: ca.CertFile}})
	if err == nil {
		p.Close()
		t.Fatal("New succeeded")
	}
	if !publish.IsRefused(err) {
		t.Errorf("IsRefused false for %v", err)
	}
	for _, w := range []string{"TLS", "client certificate", "ConnOptions.TLSCert"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}
