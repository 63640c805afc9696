package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// TestCLIMySQLTLS runs the binary against a mariadbd that requires TLS
// (require_secure_transport=ON), with a CA, a server certificate and a client
// certificate made at test time:
//   - --mysql-tls-ca verifies the server: run --mode binlog delivers every
//     message once from the first leader term (epoch 1, no restart); status
//     and replay work over TLS too (the CA from the environment, from a
//     config file);
//   - a user created REQUIRE X509 logs in with --mysql-tls-cert and
//     --mysql-tls-key, its password from --mysql-password-file;
//   - a CA that did not sign the server's certificate, or no TLS at all,
//     exits 2 in every mode naming the TLS problem and its fix, never
//     "access denied" or GRANT.
func TestCLIMySQLTLS(t *testing.T) {
	t.Parallel() // servers of its own; mostly waits for leases and exits
	ca := testenv.NewCA(t)
	srv := testenv.StartServer(t, testenv.ServerOptions{TLS: ca, RequireSecureTransport: true})
	bin := relayBinary(t)
	verify := []string{"--mysql-tls-ca", ca.CertFile}

	t.Run("CA verifies the server", func(t *testing.T) {
		ctx := testenv.WorkContext(t)
		db := srv.CreateDatabase(t)
		b := testenv.RabbitMQ(t)
		migrateTLS(t, db, verify...)
		v := consumeAll(t, b)
		n := deliverOverTLS(ctx, t, db, b, v, append([]string{"--mode", "binlog"}, verify...)...)

		// The flags come from the environment and a config file as well.
		r := runBinary(t, bin, []string{envName("mysql-tls-ca") + "=" + ca.CertFile}, "status", "--json", "--mysql-dsn", db.DSN)
		var list []statusJSON
		if err := json.Unmarshal([]byte(r.stdout), &list); r.code != 0 || err != nil || len(list) != 1 {
			t.Fatalf("status over TLS: %+v (%v)", r, err)
		}
		if s := list[0]; s.RelayName != "default" || s.Epoch != 1 || s.Mode != "binlog" {
			t.Fatalf("status over TLS: relay %q epoch %d mode %q; want default, 1, binlog", s.RelayName, s.Epoch, s.Mode)
		}

		// replay reads the binlog with its own connection: over TLS too.
		cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
		if err := os.WriteFile(cfgFile, fmt.Appendf(nil, "mysql-tls-ca: %s\n", ca.CertFile), 0o600); err != nil {
			t.Fatal(err)
		}
		r = runBinary(t, bin, nil, "replay", "--config", cfgFile, "--mysql-dsn", db.DSN, "--from-time", "2000-01-01T00:00:00Z", "--dry-run",
			"--json", "--log-format", "console")
		var sum struct{ Messages int }
		if err := json.Unmarshal([]byte(r.stdout), &sum); r.code != 0 || err != nil || sum.Messages != n {
			t.Fatalf("replay --dry-run over TLS: %d messages (%v), want %d: %+v", sum.Messages, err, n, r)
		}
	})

	t.Run("REQUIRE X509 user with a client certificate and a password file", func(t *testing.T) {
		ctx := testenv.WorkContext(t)
		db := srv.CreateDatabase(t)
		b := testenv.RabbitMQ(t)
		migrateTLS(t, db, verify...)
		user, pw := fmt.Sprintf("x509_%d", rand.N(1_000_000_000)), fmt.Sprintf("pw-%d", rand.Uint64())
		for _, q := range []string{
			fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s' REQUIRE X509", user, pw),
			fmt.Sprintf("GRANT ALL ON `%s`.* TO '%s'@'%%'", db.Name, user),
			fmt.Sprintf("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '%s'@'%%'", user),
		} {
			if _, err := db.SQL.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		t.Cleanup(func() { db.SQL.Exec(fmt.Sprintf("DROP USER '%s'@'%%'", user)) })
		pwFile := filepath.Join(t.TempDir(), "mysql-password")
		if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		dsn := fmt.Sprintf("%s@tcp(%s:%d)/%s", user, db.Host, db.Port, db.Name)
		client := ca.Issue(t, "relay")
		withoutCert := append([]string{"--mysql-dsn", dsn, "--mysql-password-file", pwFile}, verify...)
		withCert := append(withoutCert, "--mysql-tls-cert", client.CertFile, "--mysql-tls-key", client.KeyFile)

		expectExit(t, newRelayProc(t, relayArgs(t, db, b, withoutCert...)...), 2,
			[]string{"access denied", "REQUIRE X509 needs --mysql-tls-cert and --mysql-tls-key"}, []string{pw})
		v := consumeAll(t, b)
		deliverOverTLS(ctx, t, db, b, v, append([]string{"--mode", "binlog"}, withCert...)...)
	})

	t.Run("a CA that did not sign the server's certificate exits 2", func(t *testing.T) {
		db := srv.CreateDatabase(t)
		b := testenv.RabbitMQ(t)
		other := testenv.NewCA(t)
		for _, mode := range []string{"auto", "binlog", "poll"} {
			t.Run(mode, func(t *testing.T) {
				expectExit(t, newRelayProc(t, relayArgs(t, db, b, "--mode", mode, "--mysql-tls-ca", other.CertFile)...), 2,
					[]string{"the server's certificate is not signed by --mysql-tls-ca", "give --mysql-tls-ca the CA certificate that signed"},
					[]string{"access denied", "GRANT"})
			})
		}
	})

	t.Run("no TLS exits 2 naming require_secure_transport", func(t *testing.T) {
		db := srv.CreateDatabase(t)
		b := testenv.RabbitMQ(t)
		want := []string{"the server requires TLS (require_secure_transport=ON)", "add tls=true to --mysql-dsn or set --mysql-tls-ca"}
		for _, mode := range []string{"auto", "binlog", "poll"} {
			t.Run(mode, func(t *testing.T) {
				expectExit(t, newRelayProc(t, relayArgs(t, db, b, "--mode", mode)...), 2, want, []string{"access denied", "GRANT"})
			})
		}
		r := runBinary(t, bin, nil, "status", "--mysql-dsn", db.DSN)
		for _, w := range want {
			if r.code != 2 || !strings.Contains(r.stderr, w) {
				t.Fatalf("status without TLS: exit %d, stderr %q; want 2 and %q", r.code, r.stderr, w)
			}
		}
	})
}

// migrateTLS applies the schema with the binary, over TLS with flags.
func migrateTLS(t *testing.T, db *testenv.DB, flags ...string) {
	t.Helper()
	if r := runBinary(t, relayBinary(t), nil, append([]string{"migrate", "--mysql-dsn", db.DSN}, flags...)...); r.code != 0 {
		t.Fatalf("migrate over TLS: %+v", r)
	}
}

// deliverOverTLS runs a relay with relayArgs plus extra, writes 30
// transactions once it tails the binlog and checks that every message
// arrived once, in order, all from the first leader term; then stops the
// relay (SIGTERM, exit 0). It returns the number of messages.
func deliverOverTLS(ctx context.Context, t *testing.T, db *testenv.DB, b *testenv.Broker, v *validator.Validator, extra ...string) int {
	t.Helper()
	relay := newRelayProc(t, relayArgs(t, db, b, extra...)...)
	relay.start()
	relay.waitLog(ctx, "tailing the binlog")
	msgs := writeTxns(ctx, t, db, v, b.Exchange, "tls", 30)
	waitUnique(ctx, t, v, relay, len(msgs))
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	for _, d := range v.Deliveries() {
		if e, _ := d.Headers["x-relay-epoch"].(int64); e != 1 {
			t.Fatalf("a message went out under epoch %d: want all from the first leader term (epoch 1, no restart)", e)
		}
	}
	if code, took := relay.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM: exit code %d after %v", code, took)
	}
	if e := progressEpoch(ctx, t, db); e != 1 {
		t.Fatalf("progress epoch %d: want 1 (one leader term)", e)
	}
	return len(msgs)
}
