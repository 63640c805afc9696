package main

// No password is ever printed: every subcommand, on its failure and success
// paths, with distinctive passwords in the DSN and the AMQP URL.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// Distinctive passwords. The MySQL one has every character that splits a
// DSN; the AMQP ones need percent-encoding in a URL. Each comes with
// fragments that show a password cut in two by a wrong split.
var (
	leakMySQLPassword = secretUnderTest{"the MySQL password", "p@ss:w/rd(x)9Q", []string{"p@ss:w", "ss:w", "rd(x)9Q"}}
	leakAMQPPassword  = secretUnderTest{"the AMQP password", "mq-Pw7/h:k@z", []string{"mq-Pw7", "h:k@z"}}
	leakNode2Password = secretUnderTest{"the AMQP password of the second URL", "node2-Pw8/q", []string{"node2-Pw8"}}
)

type secretUnderTest struct {
	what      string
	password  string
	fragments []string
}

// needles are the strings whose presence in output shows the password: the
// password as it is, in the encodings a URL, JSON or a Go %q would give it,
// and its fragments.
func (s secretUnderTest) needles() map[string]string {
	out := map[string]string{s.password: s.what}
	js, _ := json.Marshal(s.password)
	quoted := strconv.Quote(s.password)
	for form, text := range map[string]string{
		"query-escaped":    url.QueryEscape(s.password),
		"path-escaped":     url.PathEscape(s.password),
		"userinfo-escaped": strings.TrimPrefix(url.UserPassword("", s.password).String(), ":"),
		"JSON-escaped":     string(js[1 : len(js)-1]),
		"Go-quoted":        quoted[1 : len(quoted)-1],
	} {
		if _, dup := out[text]; !dup {
			out[text] = s.what + ", " + form
		}
	}
	for _, f := range s.fragments {
		out[f] = s.what + ", a fragment of it"
	}
	return out
}

// leakScanner fails the test for every password found in what it is given.
type leakScanner struct {
	t       *testing.T
	needles map[string]string
}

func newLeakScanner(t *testing.T, secrets ...secretUnderTest) *leakScanner {
	n := map[string]string{}
	for _, s := range secrets {
		for k, v := range s.needles() {
			n[k] = v
		}
	}
	return &leakScanner{t: t, needles: n}
}

// check reports each password found in text, naming where it appeared.
func (l *leakScanner) check(where, text string) {
	l.t.Helper()
	keys := make([]string, 0, len(l.needles))
	for k := range l.needles {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if i := strings.Index(text, k); i >= 0 {
			from, to := max(0, i-120), min(len(text), i+len(k)+60)
			l.t.Errorf("%s shows %s (%q): ...%s...", where, l.needles[k], k, text[from:to])
		}
	}
}

// checkResult scans a command's stdout and stderr.
func (l *leakScanner) checkResult(what string, r result) {
	l.t.Helper()
	l.check(what+": stdout", r.stdout)
	l.check(what+": stderr", r.stderr)
}

// amqpURLWith is base (an AMQP URL) with the given user and password,
// percent-encoded as a URL needs it.
func amqpURLWith(t *testing.T, base, user, password string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("amqp://%s:%s@%s%s", user, url.QueryEscape(password), u.Host, u.EscapedPath())
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// mysqlUser creates a user with password on the server of root, with the
// relay's grants (docs/operations.md) and all privileges on the named
// databases (which need not exist); it is dropped at cleanup.
func mysqlUser(t *testing.T, root *testenv.DB, password string, databases ...string) string {
	t.Helper()
	user := "leak_" + randomHex(t, 4)
	quoted := "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(password) + "'"
	opsExec(t, root, "CREATE USER '"+user+"'@'%' IDENTIFIED BY "+quoted)
	t.Cleanup(func() {
		if _, err := root.SQL.Exec("DROP USER IF EXISTS '" + user + "'@'%'"); err != nil {
			t.Errorf("drop MySQL user %s: %v", user, err)
		}
	})
	opsExec(t, root, "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '"+user+"'@'%'")
	for _, db := range databases {
		opsExec(t, root, "GRANT ALL PRIVILEGES ON `"+db+"`.* TO '"+user+"'@'%'")
	}
	return user
}

// rabbitUser creates a user with password and full rights on vhost / of the
// local broker (with rabbitmqctl, as the broker's host allows); it is
// deleted at cleanup.
func rabbitUser(t *testing.T, password string) string {
	t.Helper()
	user := "leak-" + randomHex(t, 4)
	ctl := func(args ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "rabbitmqctl", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("rabbitmqctl %s: %v\n%s", args[0], err, out)
		}
		return nil
	}
	if err := ctl("add_user", user, password); err != nil {
		t.Fatalf("create a RabbitMQ user on the local broker: %v", err)
	}
	t.Cleanup(func() {
		if err := ctl("delete_user", user); err != nil {
			t.Errorf("delete RabbitMQ user %s: %v", user, err)
		}
	})
	if err := ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*"); err != nil {
		t.Fatal(err)
	}
	return user
}

// leakSetup is one setting every subcommand runs in.
type leakSetup struct {
	dsn, amqpURL string
	root         *testenv.DB                  // the database dsn names, as root; nil when it is not reachable or does not exist
	broker       *testenv.Broker              // the test's exchange and queue, on the broker amqpURL names when it answers
	relay        func(*testing.T, *relayProc) // waits for what the running relay must reach; nil: run exits by itself
	succeeds     bool                         // every command must exit 0
	relayName    string                       // --relay-name (OUTBOX_RELAY_RELAY_NAME); "" for the default
}

// TestNoPasswordPrinted runs every subcommand with distinctive passwords in
// the DSN and the AMQP URL (a list of two URLs where the broker does not
// answer) through a database that does not answer, a database that does not
// exist, a broker that does not answer, a DSN and URLs that do not parse, and
// real servers, and searches everything printed, logged and served over HTTP
// for the passwords.
func TestNoPasswordPrinted(t *testing.T) {
	t.Parallel() // its relays have relay names of their own on the shared server
	scan := newLeakScanner(t, leakMySQLPassword, leakAMQPPassword, leakNode2Password)
	bin := relayBinary(t)
	b := testenv.RabbitMQ(t)
	dbBroker, dbOK := testenv.MySQL(t), testenv.MySQL(t)
	missing := dbOK.Name + "_missing"
	user := mysqlUser(t, dbOK, leakMySQLPassword.password, dbBroker.Name, dbOK.Name, missing)
	dsnOf := func(addr, name string) string {
		return fmt.Sprintf("%s:%s@tcp(%s)/%s?timeout=5s", user, leakMySQLPassword.password, addr, name)
	}
	addr := fmt.Sprintf("%s:%d", dbOK.Host, dbOK.Port)
	// Nothing listens on port 1: a database or broker that does not answer.
	deadBrokers := amqpURLWith(t, "amqp://127.0.0.1:1/", "leak", leakAMQPPassword.password) + "," +
		amqpURLWith(t, "amqp://127.0.0.1:1/", "leak2", leakNode2Password.password)

	t.Run("help_and_version", func(t *testing.T) {
		scan := &leakScanner{t: t, needles: scan.needles}
		env := leakEnv(dsnOf(addr, dbOK.Name), deadBrokers)
		scan.checkResult("version", runBinary(t, bin, env, "version"))
		scan.checkResult("help", runBinary(t, bin, env, "help"))
		for name := range commands {
			scan.checkResult(name+" --help", runBinary(t, bin, env, name, "--help"))
			scan.checkResult("help "+name, runBinary(t, bin, env, "help", name))
			scan.checkResult(name+" --mysql-dsn ... --help", runBinary(t, bin, env, name,
				"--mysql-dsn", dsnOf(addr, dbOK.Name), "--help"))
		}
	})
	setups := map[string]*leakSetup{
		"database_unreachable": {dsn: dsnOf("127.0.0.1:1", dbOK.Name), amqpURL: deadBrokers},
		// Neither parses: the passwords are not encoded, the DSN lacks its
		// database.
		"malformed": {dsn: user + ":" + leakMySQLPassword.password + "@tcp(127.0.0.1:1)",
			amqpURL: "amqp://leak:" + leakAMQPPassword.password + "@127.0.0.1:1/,amqp://leak2:" + leakNode2Password.password + "@127.0.0.1:1/"},
		"database_missing": {dsn: dsnOf(addr, missing), amqpURL: deadBrokers},
		// Relay names of their own: the leadership lock is named for the
		// relay name alone, server-wide, and other tests run relays on the
		// same server at the same time.
		"broker_unreachable": {dsn: dsnOf(addr, dbBroker.Name), amqpURL: deadBrokers, root: dbBroker, broker: b, relayName: "leak-unreachable",
			relay: func(t *testing.T, p *relayProc) { waitReadyz(t, p, 503, "connect to AMQP broker") }},
		"success": {dsn: dsnOf(addr, dbOK.Name), amqpURL: amqpURLWith(t, b.URL, rabbitUser(t, leakAMQPPassword.password), leakAMQPPassword.password),
			root: dbOK, broker: b, succeeds: true, relayName: "leak-success", relay: func(t *testing.T, p *relayProc) { waitReadyz(t, p, 200, "ready") }},
	}
	for name, s := range setups {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			scan := &leakScanner{t: t, needles: scan.needles}
			leakSession(t, scan, bin, s)
		})
	}
}

// leakEnv is the environment of the commands: the DSN and the URL, and
// debug logs, where libraries say the most.
func leakEnv(dsn, amqpURL string) []string {
	return []string{"OUTBOX_RELAY_MYSQL_DSN=" + dsn, "OUTBOX_RELAY_AMQP_URL=" + amqpURL, "OUTBOX_RELAY_LOG_LEVEL=debug"}
}

// waitReadyz waits until /readyz of the running relay answers code with a
// body containing want.
func waitReadyz(t *testing.T, p *relayProc, code int, want string) {
	t.Helper()
	ctx := testenv.WorkContext(t)
	base := p.metricsURL(ctx)
	var (
		c    int
		body string
		err  error
	)
	if werr := progress.Wait(ctx, "/readyz", nil, func() bool {
		c, body, err = httpGet(base + "/readyz")
		return err == nil && c == code && strings.Contains(body, want)
	}); werr != nil {
		t.Fatalf("/readyz answers %d %q (%v), want %d with %q: %v", c, body, err, code, want, werr)
	}
}

// leakSession runs every subcommand in s, in an order that gives each
// something to work on in the success setup (run delivers, pause stops it,
// checkpoint set moves it, replay republishes what it delivered, failed
// finds a failure), and scans what each printed.
func leakSession(t *testing.T, scan *leakScanner, bin string, s *leakSetup) {
	env := leakEnv(s.dsn, s.amqpURL)
	if s.relayName != "" {
		env = append(env, "OUTBOX_RELAY_RELAY_NAME="+s.relayName)
	}
	ops := func(args ...string) {
		t.Helper()
		r := runBinary(t, bin, env, args...)
		what := strings.Join(args, " ")
		t.Logf("%s: exit %d: %s", what, r.code, lastLine(r.stderr))
		scan.checkResult(what, r)
		if strings.Contains(r.stderr, "\ngoroutine ") {
			t.Errorf("%s panicked:\n%s", what, r.stderr)
		}
		if s.succeeds && r.code != 0 {
			t.Errorf("%s: exit %d, want 0\nstdout: %s\nstderr: %s", what, r.code, r.stdout, r.stderr)
		}
	}
	ctx := testenv.WorkContext(t)
	ops("migrate", "--partitioned")
	position := "0-1-1" // any, where the database does not answer
	if s.root != nil {
		position = gtidPos(t, s.root)
	}

	p := leakRelay(ctx, t, scan, s)
	ops("status")
	ops("status", "--json")
	ops("pause", "--wait", "10s")
	ops("checkpoint", "show")
	ops("checkpoint", "show", "--json")
	ops("checkpoint", "set", "--gtid", position)
	ops("resume")
	if p.running() {
		if code, _ := p.terminate(30 * time.Second); code != 0 {
			t.Errorf("run: SIGTERM: exit code %d", code)
		}
	}
	scan.check("run: output", p.output())
	// The range holds the produced messages: the replay publishes them.
	ops("replay", "--from-gtid", position, "--exchange", s.exchange())

	failedID := "01890a5d-ac96-774b-bcce-b302099a8057"
	if s.root != nil {
		id := newMessageID(t)
		opsFailed(t, s.root, 1, id, "k-1", s.exchange(), "", `{"n":1}`, "relay", 2*cliDay)
		failedID = id.String()
	}
	ops("failed", "list")
	ops("failed", "list", "--json")
	ops("failed", "show", failedID)
	ops("failed", "retry", failedID)
	ops("failed", "purge", "--older-than", "1d")
	ops("cleanup", "--older-than", "1d")
	ops("dedup-cleanup", "--older-than", "30d")
	ops("partitions", "--once")
	ops("bench", "--modes", "poll", "--runs", "1", "--backlog", "50", "--duration", "1s", "--latency-rate", "50", "--shapes", "")
}

// exchange is the exchange the relay and replay publish to.
func (s *leakSetup) exchange() string {
	if s.broker == nil {
		return "amq.topic"
	}
	return s.broker.Exchange
}

// leakRelay runs `run` in s: to its exit, or, where it keeps running, until
// it reaches what s waits for, delivering messages where the servers answer
// (all of them, once each, in the success setup); then it scans what
// /metrics, /healthz and /readyz serve. It returns the relay, running or
// not.
func leakRelay(ctx context.Context, t *testing.T, scan *leakScanner, s *leakSetup) *relayProc {
	t.Helper()
	var v *validator.Validator
	if s.succeeds {
		v = consumeAll(t, s.broker)
	}
	args := []string{"--mysql-dsn", s.dsn, "--amqp-url", s.amqpURL, "--default-exchange", s.exchange(),
		"--server-id", strconv.FormatUint(uint64(testenv.ServerID(t)), 10), "--log-format", "console",
		"--log-level", "debug", "--metrics-addr", "127.0.0.1:0", "--shutdown-timeout", "5s"}
	if s.relayName != "" {
		args = append(args, "--relay-name", s.relayName)
	}
	p := newRelayProc(t, args...)
	if s.relay == nil {
		p.runToExit(45 * time.Second)
		return p
	}
	p.start()
	s.relay(t, p)
	if s.root != nil {
		testload.Produce(ctx, t, s.root.SQL, v, testload.Load{Producers: 1, Partitions: 2, Total: 10, Exchange: s.exchange()})
	}
	if v != nil {
		waitUnique(ctx, t, v, p, 10)
		if err := v.Check(validator.ExactlyOnce); err != nil {
			t.Error(err)
		}
	}
	base := p.metricsURL(ctx)
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		_, body, err := httpGet(base + path)
		if err != nil {
			t.Errorf("GET %s: %v", path, err)
		}
		scan.check("run: GET "+path, body)
	}
	return p
}
