package publish_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// dialLog records what OnDial was told.
type dialLog struct {
	mu   sync.Mutex
	errs []error // nil for a dial that connected
}

func (l *dialLog) note(_ string, err error) { l.mu.Lock(); l.errs = append(l.errs, err); l.mu.Unlock() }

// last returns the outcome of the newest dial and how many there were.
func (l *dialLog) last() (error, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) == 0 {
		return nil, 0
	}
	return l.errs[len(l.errs)-1], len(l.errs)
}

// publishInOrder publishes n messages over lanes Channels of p to b's
// exchange and checks that each got Confirmed and that b's queue received
// each, first deliveries in order per lane. from numbers the messages, so
// that a second call continues the first's order.
func publishInOrder(t *testing.T, p *publish.Publisher, cons *consumer, exchange string, lanes, perLane, from int) {
	t.Helper()
	var wg sync.WaitGroup
	chans := make([]*publish.Channel, lanes)
	for lane := range lanes {
		c, res := newChannel(t, p)
		chans[lane] = c
		var msgs []publish.Message
		for i := range perLane {
			msgs = append(msgs, message(t, record(uint64(from+i*lanes+lane+1), lane, exchange, fmt.Sprintf("lane.%d", lane))))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			publishAll(t, c, msgs)
			checkResults(t, res.all(), msgs, allConfirmed)
		}()
	}
	wg.Wait()
	ds := barrier(t, cons, exchange, "barrier", chans...)
	if want := from + lanes*perLane; distinctIDs(ds) != want {
		t.Fatalf("consumer got %d distinct messages, want %d", distinctIDs(ds), want)
	}
	checkFirstDeliveryOrder(t, ds)
}

// TestTLS runs publishers against a private node whose TLS listener verifies
// client certificates (verify_peer, fail_if_no_peer_cert): messages arrive,
// in order, with a password and with the certificate alone (EXTERNAL); the
// password file is read again at each reconnect; every TLS misconfiguration
// fails New at once with an error naming TLS and the fix.
func TestTLS(t *testing.T) {
	checkGoroutines(t)
	ca := testenv.NewCA(t)
	n := testenv.StartRabbitMQ(t, testenv.RabbitTLS(ca))
	cert, key := ca.IssueFiles(t, "publisher")
	opts := publish.ConnOptions{TLSCA: ca.CertFile, TLSCert: cert, TLSKey: key}
	port := n.AMQPSURL()[strings.LastIndexByte(n.AMQPSURL(), ':')+1 : len(n.AMQPSURL())-1]

	t.Run("password", func(t *testing.T) {
		b := n.Broker(t)
		p := newPublisher(t, n.AMQPSURL(), func(c *publish.Config) { c.Conn = opts })
		publishInOrder(t, p, consume(t, b.URL, b.Queue), b.Exchange, 4, 250, 0)
	})

	t.Run("external", func(t *testing.T) {
		b := n.Broker(t)
		n.AddUser(t, "publisher", "")
		p := newPublisher(t, "amqps://localhost:"+port+"/", func(c *publish.Config) { c.Conn = opts })
		publishInOrder(t, p, consume(t, b.URL, b.Queue), b.Exchange, 2, 100, 0)
		found := false
		for _, c := range n.Connections(t) {
			found = found || c.User == "publisher" && c.AuthMechanism == "EXTERNAL"
		}
		if !found {
			t.Errorf("no connection as publisher with EXTERNAL: %+v", n.Connections(t))
		}
	})

	t.Run("password_file_reread", func(t *testing.T) {
		const user, first, second = "rotating", "first-Pw-0c1e", "second-Pw-77d2"
		b := n.Broker(t)
		n.AddUser(t, user, first)
		file := filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(file, []byte(first+"\r\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		var dials dialLog
		o := opts
		o.PasswordFile = file
		p := newPublisher(t, "amqps://"+user+"@localhost:"+port+"/", func(c *publish.Config) {
			c.Conn, c.OnDial = o, dials.note
			c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 200*time.Millisecond
		})
		cons := consume(t, b.URL, b.Queue)
		publishInOrder(t, p, cons, b.Exchange, 2, 100, 0)

		// The file gone: the redial fails naming it, and is retried.
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		if n.CloseConnections(t, user) == 0 {
			t.Fatal("the publisher has no connection")
		}
		waitUntil(t, 30*time.Second, "a failed redial", func() bool { err, _ := dials.last(); return err != nil })
		err, _ := dials.last()
		t.Logf("redial without the file: %v", err)
		if !strings.Contains(err.Error(), file) || !errors.Is(err, os.ErrNotExist) {
			t.Errorf("redial error %q does not name the missing file %s", err, file)
		}

		// The rotated password, in the file again: the next redial reads it.
		n.Ctl(t, "change_password", user, second)
		if err := os.WriteFile(file, []byte(second+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 30*time.Second, "a redial with the new password", func() bool { err, _ := dials.last(); return err == nil })
		publishInOrder(t, p, cons, b.Exchange, 2, 100, 200)
		dials.mu.Lock()
		defer dials.mu.Unlock()
		for _, err := range dials.errs {
			if err != nil && (strings.Contains(err.Error(), first) || strings.Contains(err.Error(), second)) {
				t.Errorf("dial error shows a password: %v", err)
			}
		}
	})

	otherCA := testenv.NewCA(t)
	otherCert, otherKey := otherCA.IssueFiles(t, "publisher")
	strangerCert, strangerKey := ca.IssueFiles(t, "stranger") // no such user
	for _, c := range []struct {
		name string
		url  string
		opts publish.ConnOptions
		want []string
	}{
		{"amqp_to_tls_port", "amqp://guest:guest@" + n.TLSAddr() + "/", publish.ConnOptions{},
			[]string{"TLS", "TLS listener", "use amqps://"}},
		{"amqps_to_plain_port", "amqps://guest:guest@" + n.Addr() + "/", publish.ConnOptions{TLSCA: ca.CertFile},
			[]string{"TLS", "plain AMQP", "use amqp://"}},
		{"wrong_ca", n.AMQPSURL(), publish.ConnOptions{TLSCA: otherCA.CertFile, TLSCert: cert, TLSKey: key},
			[]string{"TLS", "not signed by a CA in ConnOptions.TLSCA " + otherCA.CertFile}},
		{"system_roots", n.AMQPSURL(), publish.ConnOptions{TLSCert: cert, TLSKey: key},
			[]string{"TLS", "system's CA certificates", "ConnOptions.TLSCA"}},
		{"host_mismatch", "amqps://guest:guest@" + n.TLSAddr() + "/", opts,
			[]string{"TLS", "does not name the host 127.0.0.1"}},
		{"no_client_certificate", n.AMQPSURL(), publish.ConnOptions{TLSCA: ca.CertFile},
			[]string{"TLS", "client certificate", "ConnOptions.TLSCert"}},
		{"client_certificate_of_other_ca", n.AMQPSURL(), publish.ConnOptions{TLSCA: ca.CertFile, TLSCert: otherCert, TLSKey: otherKey},
			[]string{"TLS", "ConnOptions.TLSCert " + otherCert, "signed by a CA the broker trusts"}},
		{"external_unknown_user", "amqps://localhost:" + port + "/", publish.ConnOptions{TLSCA: ca.CertFile, TLSCert: strangerCert, TLSKey: strangerKey},
			[]string{"ACCESS_REFUSED", "EXTERNAL", "user named after the certificate"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p, err := publish.New(ctx, publish.Config{URL: c.url, Conn: c.opts})
			if err == nil {
				p.Close()
				t.Fatal("New succeeded")
			}
			t.Logf("%v", err)
			if !publish.IsRefused(err) {
				t.Errorf("IsRefused false: retrying would not help")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q", w)
				}
			}
			if strings.Contains(err.Error(), "guest:guest") {
				t.Errorf("error shows the password")
			}
		})
	}
}
