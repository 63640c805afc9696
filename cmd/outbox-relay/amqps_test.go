package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// tlsBroker is a private RabbitMQ node with a TLS listener that verifies
// clients (testenv.RabbitTLS), and what a relay needs to reach it.
type tlsBroker struct {
	node      *testenv.RabbitNode
	ca        *testenv.CA
	cert, key string          // client certificate and key, common name tlsClientCN, signed by ca
	broker    *testenv.Broker // the test's exchange and queue, read over the plain listener
}

// tlsClientCN is the common name of tlsBroker's client certificate: the
// user EXTERNAL logs in as.
const tlsClientCN = "relay-client"

func startTLSBroker(t *testing.T) *tlsBroker {
	t.Helper()
	ca := testenv.NewCA(t)
	n := testenv.StartRabbitMQ(t, testenv.RabbitTLS(ca))
	cert, key := ca.IssueFiles(t, tlsClientCN)
	return &tlsBroker{node: n, ca: ca, cert: cert, key: key, broker: n.Broker(t)}
}

// url is the node's amqps:// URL with userinfo ("user", "user:pass" or ""
// for none) instead of guest's.
func (b *tlsBroker) url(userinfo string) string {
	rest := strings.TrimPrefix(b.node.AMQPSURL(), "amqps://guest:guest@")
	if userinfo == "" {
		return "amqps://" + rest
	}
	return "amqps://" + userinfo + "@" + rest
}

// tlsArgs are the flags of a relay on db reaching b over TLS at url with the
// client certificate, plus extra.
func (b *tlsBroker) tlsArgs(t testing.TB, db *testenv.DB, url string, extra ...string) []string {
	args := relayArgs(t, db, b.broker, "--amqp-url", url,
		"--amqp-tls-ca", b.ca.CertFile, "--amqp-tls-cert", b.cert, "--amqp-tls-key", b.key)
	return append(args, extra...)
}

// checkExternal fails the test unless user has a connection to n that
// logged in with EXTERNAL.
func checkExternal(t *testing.T, n *testenv.RabbitNode, user string) {
	t.Helper()
	conns := n.Connections(t)
	for _, c := range conns {
		if c.User == user && c.AuthMechanism == "EXTERNAL" {
			return
		}
	}
	t.Errorf("no connection as %s with EXTERNAL among %+v", user, conns)
}

// writeSecret replaces path's content the way a secret manager does: a new
// file renamed over the old one.
func writeSecret(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestRunAMQPS: the relay reaches a broker that only speaks TLS and verifies
// client certificates (verify_peer, fail_if_no_peer_cert) with
// --amqp-tls-ca/cert/key. With a password from --amqp-password-file every
// message arrives in order, and after the password is changed on the broker
// and in the file and the relay's connection is closed, delivery continues
// in the same process: the file is read again at the reconnect. Without a
// password it logs in with the certificate (EXTERNAL). amqp:// against the
// TLS port, a CA that did not sign the broker's certificate and a host the
// certificate does not name each fail with a reason naming TLS and the fix.
func TestRunAMQPS(t *testing.T) {
	t.Parallel() // servers of its own (MariaDB and RabbitMQ); mostly waits
	b := startTLSBroker(t)
	srv := testenv.StartServer(t, testenv.ServerOptions{})

	t.Run("password_file_rotation", func(t *testing.T) {
		const user, first, second = "relay-pw", "first-Secret-7f3a", "second-Secret-91cc"
		ctx := testenv.WorkContext(t)
		b.node.AddUser(t, user, first)
		pwFile := filepath.Join(t.TempDir(), "amqp-password")
		writeSecret(t, pwFile, first+"\n")
		db := srv.CreateDatabase(t)
		migrate(t, db.DSN)
		v := consumeAll(t, b.broker)
		p := newRelayProc(t, b.tlsArgs(t, db, b.url(user), "--amqp-password-file", pwFile)...)
		p.start()
		load := testload.Load{Producers: 2, Partitions: 4, Total: 200, Exchange: b.broker.Exchange}
		testload.Produce(ctx, t, db.SQL, v, load)
		waitUnique(ctx, t, v, p, 200)

		b.node.Ctl(t, "change_password", user, second)
		writeSecret(t, pwFile, second+"\n")
		if n := b.node.CloseConnections(t, user); n == 0 {
			t.Fatalf("the relay has no connection as %s", user)
		}
		testload.Produce(ctx, t, db.SQL, v, load)
		waitUnique(ctx, t, v, p, 400)
		p.waitLog(ctx, "reconnected to AMQP broker")
		if p.starts != 1 {
			t.Errorf("the relay was started %d times", p.starts)
		}
		// The connection closed under the relay may repeat what it had
		// in flight; nothing is missing and each partition is in order.
		if err := v.Check(validator.AtLeastOnce); err != nil {
			t.Error(err)
		}
		if code, _ := p.terminate(30 * time.Second); code != 0 {
			t.Errorf("SIGTERM: exit code %d", code)
		}
		for _, pw := range []string{first, second} {
			if strings.Contains(p.output(), pw) {
				t.Errorf("the relay printed the password %q", pw)
			}
		}
	})

	t.Run("external", func(t *testing.T) {
		ctx := testenv.WorkContext(t)
		b.node.AddUser(t, tlsClientCN, "") // no password: EXTERNAL only
		db := srv.CreateDatabase(t)
		migrate(t, db.DSN)
		v := consumeAll(t, b.broker)
		p := newRelayProc(t, b.tlsArgs(t, db, b.url(""))...)
		p.start()
		from := binlogPos(ctx, t, db)
		testload.Produce(ctx, t, db.SQL, v, testload.Load{Producers: 2, Partitions: 4, Total: 200, Exchange: b.broker.Exchange})
		to := binlogPos(ctx, t, db)
		waitUnique(ctx, t, v, p, 200)
		if err := v.Check(validator.ExactlyOnce); err != nil {
			t.Error(err)
		}
		checkExternal(t, b.node, tlsClientCN)
		if code, _ := p.terminate(30 * time.Second); code != 0 {
			t.Errorf("SIGTERM: exit code %d", code)
		}

		// replay takes the same flags: the range again, over TLS.
		replay := func(url, ca string) result {
			return runBinary(t, relayBinary(t), nil, "replay", "--mysql-dsn", db.DSN, "--amqp-url", url,
				"--amqp-tls-ca", ca, "--amqp-tls-cert", b.cert, "--amqp-tls-key", b.key,
				"--default-exchange", b.broker.Exchange, "--from-gtid", from, "--to-gtid", to, "--json", "--log-format", "console")
		}
		if r := replay(b.url(""), b.ca.CertFile); r.code != 0 || !strings.Contains(r.stdout, `"confirmed": 200`) {
			t.Fatalf("replay over TLS: %+v", r)
		}
		if err := progress.Wait(ctx, "replayed deliveries", func() int64 { return int64(v.Received()) },
			func() bool { return v.Received() >= 400 }); err != nil {
			t.Fatalf("%d deliveries, want 200 and 200 replayed: %v", v.Received(), err)
		}
		if r := replay(b.url(""), testenv.NewCA(t).CertFile); r.code != 2 || !strings.Contains(r.stderr, "TLS") {
			t.Errorf("replay with a wrong CA: %+v, want exit 2 naming TLS", r)
		}
	})

	otherCA := testenv.NewCA(t)
	for _, c := range []struct {
		name string
		args func(db *testenv.DB) []string
		want []string // in /readyz
	}{
		{"amqp_to_tls_port", func(db *testenv.DB) []string {
			return relayArgs(t, db, b.broker, "--amqp-url", "amqp://guest:guest@"+b.node.TLSAddr()+"/")
		}, []string{"TLS", "amqps://"}},
		{"wrong_ca", func(db *testenv.DB) []string {
			return append(b.tlsArgs(t, db, b.url("guest:guest")), "--amqp-tls-ca", otherCA.CertFile)
		}, []string{"TLS", "not signed by", "--amqp-tls-ca"}},
		{"host_mismatch", func(db *testenv.DB) []string {
			return b.tlsArgs(t, db, "amqps://guest:guest@"+b.node.TLSAddr()+"/")
		}, []string{"TLS", "127.0.0.1", "does not name"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testenv.Context(t, time.Minute)
			db := srv.CreateDatabase(t)
			migrate(t, db.DSN)
			p := newRelayProc(t, c.args(db)...)
			p.start()
			base := p.metricsURL(ctx)
			p.waitLog(ctx, "leading")
			p.waitLog(ctx, "dial AMQP broker")
			code, body, err := httpGet(base + "/readyz")
			t.Logf("/readyz %d: %s", code, strings.TrimSpace(body))
			if err != nil || code != 503 {
				t.Errorf("/readyz: %d %v, want 503", code, err)
			}
			for _, w := range c.want {
				if !strings.Contains(body, w) {
					t.Errorf("/readyz body %q does not contain %q", body, w)
				}
			}
			if code, _ := p.terminate(30 * time.Second); code != 0 {
				t.Errorf("SIGTERM: exit code %d", code)
			}
		})
	}
}

// TestCLIAMQPOptionsRefused: combinations of --amqp-url, the TLS files and
// the password file that cannot work are bad usage (exit 2), refused before
// anything connects, naming the flag or the file and never a password or
// the file's content.
func TestCLIAMQPOptionsRefused(t *testing.T) {
	t.Parallel()
	bin := relayBinary(t)
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("file-Secret-3e1d\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := testenv.NewCA(t)
	cert, _ := ca.IssueFiles(t, "client")
	missing := filepath.Join(dir, "no-such-file")
	notPEM := filepath.Join(dir, "not-pem")
	if err := os.WriteFile(notPEM, []byte("file-Secret-3e1d\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"password_twice", nil, []string{"--amqp-url", "amqps://u:url-Secret-55aa@localhost/", "--amqp-password-file", pwFile},
			[]string{"--amqp-password-file", "--amqp-url", "password"}},
		{"password_file_missing", nil, []string{"--amqp-url", "amqp://u@localhost/", "--amqp-password-file", missing},
			[]string{"--amqp-password-file", missing}},
		{"password_file_without_user", nil, []string{"--amqp-url", "amqp://localhost/", "--amqp-password-file", pwFile},
			[]string{"--amqp-password-file", "user"}},
		{"tls_files_with_amqp", nil, []string{"--amqp-url", "amqp://u:url-Secret-55aa@localhost/", "--amqp-tls-ca", ca.CertFile},
			[]string{"--amqp-tls-ca", "amqps://"}},
		{"cert_without_key", nil, []string{"--amqp-url", "amqps://localhost/", "--amqp-tls-cert", cert},
			[]string{"--amqp-tls-cert", "--amqp-tls-key"}},
		{"ca_not_pem", nil, []string{"--amqp-url", "amqps://localhost/", "--amqp-tls-ca", notPEM},
			[]string{"--amqp-tls-ca", notPEM, "PEM"}},
		{"key_missing_from_env", []string{"OUTBOX_RELAY_AMQP_TLS_KEY=" + missing},
			[]string{"--amqp-url", "amqps://localhost/", "--amqp-tls-cert", cert},
			[]string{missing}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"run", "--mysql-dsn", "u:dsn-Secret-77bb@tcp(127.0.0.1:1)/db"}, c.args...)
			r := runBinary(t, bin, c.env, args...)
			t.Logf("exit %d: %s", r.code, strings.TrimSpace(r.stderr))
			if r.code != 2 {
				t.Errorf("exit code %d, want 2", r.code)
			}
			for _, w := range c.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr does not contain %q", w)
				}
			}
			for _, s := range []string{"file-Secret-3e1d", "url-Secret-55aa", "dsn-Secret-77bb"} {
				if strings.Contains(r.stdout+r.stderr, s) {
					t.Errorf("output contains the secret %q", s)
				}
			}
		})
	}
	// The same flags in every command that connects to RabbitMQ.
	for _, cmd := range []string{"run", "replay", "bench"} {
		r := runBinary(t, bin, nil, cmd, "--help")
		for _, f := range []string{"-amqp-url", "-amqp-tls-ca", "-amqp-tls-cert", "-amqp-tls-key", "-amqp-password-file"} {
			if !strings.Contains(r.stdout, f) {
				t.Errorf("%s --help does not list %s", cmd, f)
			}
		}
	}
}
