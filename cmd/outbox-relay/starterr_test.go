package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// expectExit runs p to its exit (at most 45 s: every case here must exit by
// itself) and checks the exit code and that the error line contains each of
// want and none of forbid.
func expectExit(t *testing.T, p *relayProc, wantCode int, want, forbid []string) {
	t.Helper()
	code := p.runToExit(45 * time.Second)
	line := p.lastLine()
	t.Logf("exit code %d: %s", code, line)
	if code != wantCode {
		t.Errorf("exit code %d, want %d; last line %q", code, wantCode, line)
	}
	if !strings.HasPrefix(line, "outbox-relay: ") {
		t.Errorf("last line %q is not the error line", line)
	}
	for _, w := range want {
		if !strings.Contains(line, w) {
			t.Errorf("error line %q does not contain %q", line, w)
		}
	}
	for _, f := range forbid {
		if strings.Contains(p.output(), f) {
			t.Errorf("output contains %q", f)
		}
	}
}

// TestCLIRunBeforeMigrate: run on a database that lacks the relay's tables
// exits 2 naming `outbox-relay migrate`, instead of retrying leadership.
func TestCLIRunBeforeMigrate(t *testing.T) {
	b := testenv.RabbitMQ(t)
	t.Run("no_tables", func(t *testing.T) {
		db := testenv.MySQL(t)
		expectExit(t, newRelayProc(t, relayArgs(t, db, b)...), 2,
			[]string{"outbox_relay_progress", "does not exist", "outbox-relay migrate"}, nil)
	})
	t.Run("no_outbox_table", func(t *testing.T) {
		db := testenv.MySQL(t)
		migrate(t, db.DSN)
		if _, err := db.SQL.Exec("DROP TABLE outbox"); err != nil {
			t.Fatal(err)
		}
		expectExit(t, newRelayProc(t, relayArgs(t, db, b, "--mode", "poll")...), 2,
			[]string{`"outbox"`, "does not exist", "outbox-relay migrate"}, nil)
	})
	// Tables of an older version: a column a later migration adds is missing.
	t.Run("outdated_schema", func(t *testing.T) {
		db := testenv.MySQL(t)
		migrate(t, db.DSN)
		if _, err := db.SQL.Exec("ALTER TABLE outbox_relay_progress DROP COLUMN paused_epoch"); err != nil {
			t.Fatal(err)
		}
		expectExit(t, newRelayProc(t, relayArgs(t, db, b, "--mode", "poll")...), 2,
			[]string{"outbox_relay_progress", "paused_epoch", "is missing", "outbox-relay migrate"}, nil)
	})
}

// TestCLIRunStateFileUnwritable: a --state-file in a directory that does
// not exist stops run at once (exit 2) naming the path, instead of running
// without the check it asks for.
func TestCLIRunStateFileUnwritable(t *testing.T) {
	db := testenv.MySQL(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	path := filepath.Join(t.TempDir(), "missing", "state.json")
	expectExit(t, newRelayProc(t, relayArgs(t, db, b, "--state-file", path)...), 2, []string{path, "cannot write"}, nil)
}

// TestCLIRunBadAMQPURL: a URL that is not amqp:// or amqps:// or does not
// parse, also as one of a cluster's several, is bad usage, reported before
// connecting, without the password; so is an empty element of a list.
func TestCLIRunBadAMQPURL(t *testing.T) {
	db := testenv.MySQL(t)
	for _, c := range []struct {
		url  string
		want []string
	}{
		{"http://guest:sekret-pw@127.0.0.1:15672/", []string{"--amqp-url", "amqp://user:pass@host:5672/vhost"}},
		{"amqp://guest:sekret-pw@127.0.0.1:notaport/", []string{"--amqp-url", "amqp://user:pass@host:5672/vhost"}},
		// A cluster's second node given without its scheme.
		{"amqp://guest:sekret-pw@127.0.0.1:5672/,127.0.0.2:5672", []string{"--amqp-url", "each URL with its scheme"}},
		{"amqp://guest:sekret-pw@127.0.0.1:5672/,,amqp://guest:sekret-pw@127.0.0.2:5672/", []string{"URL 2 of 3 is empty", "remove the extra comma"}},
		{"amqp://guest:sekret-pw@127.0.0.1:5672/,", []string{"URL 2 of 2 is empty"}},
	} {
		args := append(relayArgs(t, db, &testenv.Broker{}), "--amqp-url", c.url)
		expectExit(t, newRelayProc(t, args...), 2, c.want, []string{"sekret-pw"})
	}
}

// TestCLIDurationNeedsUnit: a duration without a unit says a unit is needed
// and where the value came from (flag, environment variable, config file).
func TestCLIDurationNeedsUnit(t *testing.T) {
	bin := relayBinary(t)
	r := runBinary(t, bin, nil, "run", "--poll-interval", "5")
	if r.code != 2 || !strings.Contains(r.stderr, "-poll-interval") || !strings.Contains(r.stderr, "needs a unit") || !strings.Contains(r.stderr, "5s") {
		t.Fatalf("flag: %+v", r)
	}
	r = runBinary(t, bin, []string{"OUTBOX_RELAY_POLL_INTERVAL=5"}, "run")
	if r.code != 2 || !strings.Contains(r.stderr, "OUTBOX_RELAY_POLL_INTERVAL") || !strings.Contains(r.stderr, "needs a unit") {
		t.Fatalf("env: %+v", r)
	}
	cfg := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(cfg, []byte("poll-interval: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = runBinary(t, bin, nil, "run", "--config", cfg)
	if r.code != 2 || !strings.Contains(r.stderr, cfg) || !strings.Contains(r.stderr, "poll-interval") || !strings.Contains(r.stderr, "needs a unit") {
		t.Fatalf("config file: %+v", r)
	}
}

// TestCLIRunMySQLRefused: a server that refuses (wrong password, unknown
// database, closed port) is reported at once, naming user, host and
// database and what to check, never the password.
func TestCLIRunMySQLRefused(t *testing.T) {
	db := testenv.MySQL(t)
	b := testenv.RabbitMQ(t)
	addr := fmt.Sprintf("%s:%d", db.Host, db.Port)
	run := func(dsn string) *relayProc {
		return newRelayProc(t, append(relayArgs(t, db, b), "--mysql-dsn", dsn)...)
	}
	t.Run("access_denied", func(t *testing.T) {
		expectExit(t, run(fmt.Sprintf("%s:sekret-pw@tcp(%s)/%s", db.User, addr, db.Name)), 2,
			[]string{"access denied", `user "` + db.User + `"`, addr, db.Name, "check the password"}, []string{"sekret-pw"})
	})
	t.Run("unknown_database", func(t *testing.T) {
		expectExit(t, run(strings.Replace(db.DSN, "/"+db.Name, "/"+db.Name+"_missing", 1)), 2,
			[]string{"does not exist", addr, "CREATE DATABASE `" + db.Name + "_missing`"}, nil)
	})
	t.Run("connection_refused", func(t *testing.T) {
		expectExit(t, run(fmt.Sprintf("%s:sekret-pw@tcp(127.0.0.1:1)/%s", db.User, db.Name)), 1,
			[]string{"connection refused", "127.0.0.1:1", `user "` + db.User + `"`, db.Name, "check"}, []string{"sekret-pw"})
	})
}

// TestRunKeepsLeadershipWhileBrokerFails: a broker that refuses the
// password or the vhost, or a closed port, is retried, in either mode, while the relay keeps leadership:
// the epoch stays, outbox_relay_reconnects_total{target="amqp"} counts the
// failed attempts (with the node dialled),
// failed attempts, and /readyz names the broker (password masked) and the
// cause.
func TestRunKeepsLeadershipWhileBrokerFails(t *testing.T) {
	t.Parallel() // servers of its own; mostly waits for reconnects
	b := testenv.RabbitMQ(t)
	u, err := amqp.ParseURI(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	// A fault proxy in front of the broker, refusing connections until
	// enabled: the relay then delivers without a restart.
	proxy := testenv.Proxy(t, net.JoinHostPort(u.Host, strconv.Itoa(u.Port)))
	proxy.Disable()
	viaProxy := u
	host, port, _ := net.SplitHostPort(proxy.Addr())
	viaProxy.Host = host
	viaProxy.Port, _ = strconv.Atoi(port)
	wrongVhost := u
	wrongVhost.Vhost = "no-such-vhost"
	u.Password = "sekret-wrong"
	for _, c := range []struct {
		name, mode, url, cause string
		healed                 func() // makes the broker reachable, or nil
	}{
		{"access_refused", "poll", u.String(), "ACCESS_REFUSED", nil},
		{"access_refused_binlog", "binlog", u.String(), "ACCESS_REFUSED", nil},
		{"wrong_vhost", "binlog", wrongVhost.String(), "vhost is refused (NOT_ALLOWED)", nil},
		{"closed_port", "poll", viaProxy.String(), "connection refused", proxy.Enable},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // a server each (privateDB): each leader takes the lock of the relay name 'default'
			ctx := testenv.WorkContext(t)
			db := privateDB(t)
			migrate(t, db.DSN)
			p := newRelayProc(t, relayArgs(t, db, b, "--mode", c.mode, "--amqp-url", c.url)...)
			p.start()
			base := p.metricsURL(ctx)
			p.waitLog(ctx, "leading")
			epoch := progressEpoch(ctx, t, db)
			cu, err := amqp.ParseURI(c.url)
			if err != nil {
				t.Fatal(err)
			}
			sample := fmt.Sprintf(`outbox_relay_reconnects_total{node=%q,target="amqp"}`, net.JoinHostPort(cu.Host, strconv.Itoa(cu.Port)))
			// Four failed dials span at least 0.1+0.2+0.4 s of backoff:
			// a relay that gave up leadership on a failed dial would have
			// done so by then.
			var dials float64
			if err := progress.Wait(ctx, "failed dials", func() int64 {
				dials = metricValue(t, base, sample)
				return int64(dials)
			}, func() bool { return dials >= 4 }); err != nil {
				t.Fatalf("%s = %v, never reached 4: %v", sample, dials, err)
			}
			if e := progressEpoch(ctx, t, db); e != epoch {
				t.Errorf("epoch went from %d to %d while the broker failed: leadership was given up", epoch, e)
			}
			code, body, err := httpGet(base + "/readyz")
			t.Logf("/readyz %d: %s", code, strings.TrimSpace(body))
			if err != nil || code != 503 {
				t.Errorf("/readyz: %d %v, want 503", code, err)
			}
			for _, w := range []string{redact.URL(c.url), c.cause} {
				if !strings.Contains(body, w) {
					t.Errorf("/readyz body %q does not contain %q", body, w)
				}
			}
			if strings.Contains(body+p.output(), "sekret-wrong") {
				t.Error("the password is printed")
			}
			if c.healed != nil {
				v := consumeAll(t, b)
				c.healed()
				testload.Produce(ctx, t, db.SQL, v, testload.Load{Producers: 1, Partitions: 2, Total: 20, Exchange: b.Exchange})
				waitUnique(ctx, t, v, p, 20)
				if err := v.Check(validator.ExactlyOnce); err != nil {
					t.Error(err)
				}
				if e := progressEpoch(ctx, t, db); e != epoch {
					t.Errorf("epoch went from %d to %d before the broker came back", epoch, e)
				}
				// Ready again, naming the broker node in use (no credentials).
				node := net.JoinHostPort(cu.Host, strconv.Itoa(cu.Port))
				if code, body, err := httpGet(base + "/readyz"); err != nil || code != 200 || !strings.Contains(body, "publishing to RabbitMQ node "+node) {
					t.Errorf("/readyz once the broker answers: %d %q %v, want 200 naming node %s", code, body, err, node)
				}
			}
			if code, _ := p.terminate(30 * time.Second); code != 0 {
				t.Errorf("SIGTERM: exit code %d", code)
			}
		})
	}
}
