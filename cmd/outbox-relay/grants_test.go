package main

// Least privilege, run for real: the GRANT statements of docs/operations.md
// ("Grants per role") are read from the page itself, each role gets a user
// holding exactly them, and every command runs through its normal path as
// its role's user.

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/dedup"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// docGrant is one GRANT statement of the docs: privileges on an object
// (`*.*`, `app.*` or `app.<table>`) to a role's user.
type docGrant struct {
	privs  []string
	object string
}

// grantLine matches the docs' statements: GRANT A, B ON object TO 'user'@'%';
var grantLine = regexp.MustCompile(`^GRANT (.+) ON (\S+) TO '[a-z_]+'@'%';$`)

// docGrants reads the sql blocks of the section "Grants per role" of
// docs/operations.md: a block whose first line is "-- <role>" holds that
// role's statements.
func docGrants(t *testing.T) map[string][]docGrant {
	t.Helper()
	f, err := os.Open("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	roles := map[string][]docGrant{}
	var inSection, inBlock bool
	role := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "### Grants per role":
			inSection = true
		case inSection && strings.HasPrefix(line, "#### MySQL 8"):
			inSection = false
		case !inSection:
		case line == "```sql":
			inBlock, role = true, ""
		case inBlock && line == "```":
			inBlock = false
		case inBlock && role == "" && strings.HasPrefix(line, "-- "):
			role = strings.TrimPrefix(line, "-- ")
		case inBlock && strings.HasPrefix(line, "GRANT "):
			m := grantLine.FindStringSubmatch(line)
			if m == nil || role == "" {
				t.Fatalf("docs/operations.md: grant %q is not of the form GRANT ... ON ... TO 'user'@'%%'; in a role's block", line)
			}
			roles[role] = append(roles[role], docGrant{privs: strings.Split(m[1], ", "), object: m[2]})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"outbox-relay migrate", "outbox-relay run", "producer", "outbox-relay operator commands", "inbox consumer"} {
		if len(roles[r]) == 0 {
			t.Fatalf("docs/operations.md, Grants per role: no GRANT statements for %q (found %v)", r, roles)
		}
	}
	return roles
}

// roleUser creates a user on db's server holding grants (the docs' `app`
// being db), dropped at cleanup, and returns its DSN.
func roleUser(ctx context.Context, t *testing.T, db *testenv.DB, name string, grants []docGrant) string {
	t.Helper()
	user := fmt.Sprintf("%s_%06x", name, rand.Uint32N(1<<24))
	stmts := []string{fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY 'pw-%s'", user, user)}
	for _, g := range grants {
		if len(g.privs) == 0 {
			continue
		}
		object := g.object
		if schema, table, ok := strings.Cut(object, "."); ok && schema == "app" {
			if table != "*" {
				table = "`" + table + "`"
			}
			object = "`" + db.Name + "`." + table
		}
		stmts = append(stmts, fmt.Sprintf("GRANT %s ON %s TO '%s'@'%%'", strings.Join(g.privs, ", "), object, user))
	}
	t.Cleanup(func() {
		if _, err := db.SQL.Exec(fmt.Sprintf("DROP USER IF EXISTS '%s'@'%%'", user)); err != nil {
			t.Errorf("drop user %s: %v", user, err)
		}
	})
	for _, q := range stmts {
		if _, err := db.SQL.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return fmt.Sprintf("%s:pw-%s@tcp(%s:%d)/%s", user, user, db.Host, db.Port, db.Name)
}

// opsAs runs an operator command as the user of dsn.
func opsAs(t *testing.T, dsn string, args ...string) result {
	t.Helper()
	return runBinary(t, relayBinary(t), []string{"OUTBOX_RELAY_MYSQL_DSN=" + dsn, "OUTBOX_RELAY_LOG_FORMAT=console"}, args...)
}

func openAs(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pool := sql.OpenDB(connector)
	t.Cleanup(func() { pool.Close() })
	return pool
}

// Every role with exactly the documented grants: migrate (a partitioned
// outbox), the relay in binlog mode delivering a producer's messages (as
// the producer role) end to end and moving an undeliverable one to
// outbox_failed, an inbox consumer processing them and giving one up,
// status, pause (the wake stops the leader long before its heartbeat) and
// resume, checkpoint show and set, replay, failed list, show, retry and
// purge, cleanup, dedup-cleanup and partitions, each as its role's user.
// The relay says once, in words, that it could not check its server id.
// Then run's own grants are taken away one at a time: run refuses to start
// (exit 2), naming the privilege, the table and the GRANT that adds it.
func TestGrantsPerRole(t *testing.T) {
	ctx := testenv.WorkContext(t)
	db := testenv.MySQL(t)
	b := testenv.RabbitMQ(t)
	roles := docGrants(t)

	migrateDSN := roleUser(ctx, t, db, "g_migrate", roles["outbox-relay migrate"])
	if r := opsAs(t, migrateDSN, "migrate", "--partitioned"); r.code != 0 {
		t.Fatalf("migrate as the migrate role: %+v", r)
	}
	relayDSN := roleUser(ctx, t, db, "g_run", roles["outbox-relay run"])
	producerDSN := roleUser(ctx, t, db, "g_producer", roles["producer"])
	operatorDSN := roleUser(ctx, t, db, "g_operator", roles["outbox-relay operator commands"])
	inboxDSN := roleUser(ctx, t, db, "g_inbox", roles["inbox consumer"])

	v := consumeAll(t, b)
	inbox := startLimitedInbox(ctx, t, db, b, inboxDSN)
	// A heartbeat far longer than the test: the leader stops for the pause
	// before its first heartbeat only if pause woke it.
	const heartbeat, lease = time.Minute, 3 * time.Minute
	relay := newRelayProc(t, relayArgs(t, db, b, "--mysql-dsn", relayDSN, "--mode", "binlog",
		"--heartbeat-interval", heartbeat.String(), "--leader-lease", lease.String())...)
	started := time.Now()
	relay.start()
	relay.waitLog(ctx, "tailing the binlog")

	const total = 200
	producer := openAs(t, producerDSN)
	from := gtidPos(t, db)
	testload.Produce(ctx, t, producer, v, testload.Load{Producers: 2, Partitions: 10, Total: total, Exchange: b.Exchange})
	lost, err := outbox.Enqueue(ctx, producer, outbox.Message{Exchange: "missing-" + db.Name, RoutingKey: "rk", Payload: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	to := gtidPos(t, db)
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox_failed WHERE source = 'relay'", 1)
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox_failed WHERE source = 'inbox'", 1)
	inbox.wait(ctx, t, total-1, 1)

	// status, pause (woken), checkpoint show and set, resume.
	r := opsAs(t, operatorDSN, "status", "--json", "--leader-lease", lease.String())
	var list []statusJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list) != 1 || list[0].Leader == nil ||
		!list[0].Leader.Alive || list[0].FailedRows != 2 || list[0].Mode != "binlog" {
		t.Fatalf("status as the operator: %+v\n%+v", r, list)
	}
	r = opsAs(t, operatorDSN, "pause", "--json", "--wait", pauseWait, "--leader-lease", lease.String())
	var paused pauseJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &paused) != nil || paused.Paused == nil || !paused.Paused.LeaderStopped ||
		paused.Checkpoint.GTIDSet == nil {
		t.Fatalf("pause as the operator: %+v", r)
	}
	if since := time.Since(started); since >= heartbeat {
		t.Fatalf("the leader stopped %v after it started, not before its first heartbeat (%v): cannot tell whether pause woke it", since, heartbeat)
	}
	if r = opsAs(t, operatorDSN, "checkpoint", "show", "--json"); r.code != 0 || !strings.Contains(r.stdout, *paused.Checkpoint.GTIDSet) {
		t.Fatalf("checkpoint show as the operator: %+v", r)
	}
	if r = opsAs(t, operatorDSN, "checkpoint", "set", "--gtid", *paused.Checkpoint.GTIDSet, "--leader-lease", lease.String()); r.code != 0 {
		t.Fatalf("checkpoint set as the operator: %+v", r)
	}
	if r = opsAs(t, operatorDSN, "resume"); r.code != 0 || !strings.Contains(r.stdout, "resumed") {
		t.Fatalf("resume as the operator: %+v", r)
	}

	// replay of the producers' range: every row, the failed one included.
	r = opsAs(t, operatorDSN, "replay", "--dry-run", "--json", "--from-gtid", from, "--to-gtid", to)
	var rep struct {
		Messages int `json:"messages"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.Messages != total+1 {
		t.Fatalf("replay --dry-run as the operator: want %d messages: %+v", total+1, r)
	}

	// failed: list, show, retry (the relay fails it again), purge.
	r = opsAs(t, operatorDSN, "failed", "list", "--json")
	var failed struct {
		Total int `json:"total"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &failed) != nil || failed.Total != 2 {
		t.Fatalf("failed list as the operator: %+v", r)
	}
	if r = opsAs(t, operatorDSN, "failed", "show", lost[0].String()); r.code != 0 || !strings.Contains(r.stdout, "missing-"+db.Name) {
		t.Fatalf("failed show as the operator: %+v", r)
	}
	firstRow := opsCount(t, db, "SELECT MAX(id) FROM outbox_failed")
	if r = opsAs(t, operatorDSN, "failed", "retry", lost[0].String()); r.code != 0 {
		t.Fatalf("failed retry as the operator: %+v", r)
	}
	testload.WaitRows(ctx, t, db.SQL, fmt.Sprintf("SELECT COUNT(*) FROM outbox_failed WHERE source = 'relay' AND id > %d", firstRow), 1)
	inboxFailure := opsCount(t, db, "SELECT id FROM outbox_failed WHERE source = 'inbox'")
	if r = opsAs(t, operatorDSN, "failed", "purge", lost[0].String(), fmt.Sprint(inboxFailure)); r.code != 0 {
		t.Fatalf("failed purge as the operator: %+v", r)
	}
	if n := opsCount(t, db, "SELECT COUNT(*) FROM outbox_failed"); n != 0 {
		t.Fatalf("%d rows in outbox_failed after the purge", n)
	}

	if code, _ := relay.terminate(time.Minute); code != 0 {
		t.Fatalf("relay exit code %d", code)
	}
	// The server id check needs REPLICATION MASTER ADMIN, which run does
	// not get: said once, in words.
	out := relay.output()
	if n := strings.Count(out, "not checked against the server's other replicas"); n != 1 ||
		!strings.Contains(out, "needs the REPLICATION MASTER ADMIN privilege") || strings.Contains(out, "Error 1227") ||
		strings.Contains(out, "Error 1064") {
		t.Errorf("the server id warning is not said once, in words (%d times):\n%s", n, grepLines(out, "server id"))
	}

	// Housekeeping: nothing to clean up here, but through the whole path;
	// the partitions past the retention are dropped.
	if r = opsAs(t, operatorDSN, "cleanup", "--older-than", "7d"); r.code != 0 {
		t.Fatalf("cleanup as the operator: %+v", r)
	}
	if r = opsAs(t, operatorDSN, "dedup-cleanup", "--older-than", "7d"); r.code != 0 {
		t.Fatalf("dedup-cleanup as the operator: %+v", r)
	}
	var first, bound string
	if err := db.SQL.QueryRowContext(ctx, `SELECT PARTITION_NAME, PARTITION_DESCRIPTION FROM information_schema.PARTITIONS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox' ORDER BY PARTITION_ORDINAL_POSITION LIMIT 1`).Scan(&first, &bound); err != nil {
		t.Fatal(err)
	}
	opsExec(t, db, fmt.Sprintf("ALTER TABLE outbox REORGANIZE PARTITION %s INTO (PARTITION p20200101 VALUES LESS THAN ('2020-01-02'), PARTITION %s VALUES LESS THAN (%s))", first, first, bound))
	r = opsAs(t, operatorDSN, "partitions", "--once", "--retention", "7d", "--lookahead", "9", "--json")
	var parts struct {
		Added   []string `json:"added"`
		Dropped []string `json:"dropped"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &parts) != nil || !slices.Equal(parts.Dropped, []string{"p20200101"}) || len(parts.Added) == 0 {
		t.Fatalf("partitions as the operator: %+v", r)
	}

	t.Run("run without", func(t *testing.T) { testRunWithout(ctx, t, db, b, roles["outbox-relay run"]) })
	t.Run("run mark", func(t *testing.T) { testRunMarkGrants(ctx, t, db, b, roles["outbox-relay run"]) })
}

// testRunMarkGrants: with --on-delivered=mark the relay needs UPDATE on the
// outbox instead of DELETE, as the docs say: it starts with SELECT, UPDATE
// and refuses to without UPDATE.
func testRunMarkGrants(ctx context.Context, t *testing.T, db *testenv.DB, b *testenv.Broker, grants []docGrant) {
	mark := slices.Clone(grants)
	var outboxGrant int
	for i, g := range mark {
		if g.object == "app.outbox" {
			outboxGrant = i
			mark[i].privs = []string{"SELECT", "UPDATE"}
		}
	}
	p := newRelayProc(t, relayArgs(t, db, b, "--mysql-dsn", roleUser(ctx, t, db, "g_mark", mark), "--mode", "binlog", "--on-delivered", "mark")...)
	p.start()
	p.waitLog(ctx, "tailing the binlog")
	if code, _ := p.terminate(time.Minute); code != 0 {
		t.Fatalf("relay with --on-delivered=mark and SELECT, UPDATE on the outbox: exit code %d", code)
	}
	mark[outboxGrant].privs = []string{"SELECT", "DELETE"}
	p = newRelayProc(t, relayArgs(t, db, b, "--mysql-dsn", roleUser(ctx, t, db, "g_mark", mark), "--mode", "binlog", "--on-delivered", "mark")...)
	code := p.runToExit(20 * time.Second)
	if line := p.lastLine(); code != 2 || !strings.Contains(line, "lacks UPDATE on `"+db.Name+"`.`outbox` (delivered rows are marked") {
		t.Fatalf("relay with --on-delivered=mark without UPDATE on the outbox: exit code %d, %s", code, line)
	}
}

// testRunWithout starts run in binlog mode once per privilege of grants,
// as a user holding all of grants but that one: it must exit 2 naming the
// privilege and, for a table's, the table and the GRANT that adds it.
func testRunWithout(ctx context.Context, t *testing.T, db *testenv.DB, b *testenv.Broker, grants []docGrant) {
	for i, g := range grants {
		for j, priv := range g.privs {
			name := priv + " on " + g.object
			t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
				less := slices.Clone(grants)
				less[i].privs = slices.Delete(slices.Clone(g.privs), j, j+1)
				dsn := roleUser(ctx, t, db, "g_less", less)
				p := newRelayProc(t, relayArgs(t, db, b, "--mysql-dsn", dsn, "--mode", "binlog")...)
				// Preflight failures exit within a second or two.
				code := p.runToExit(20 * time.Second)
				line := p.lastLine()
				t.Logf("exit code %d: %s", code, line)
				want := []string{"lacks " + priv}
				if _, table, ok := strings.Cut(g.object, "."); ok && table != "*" {
					quoted := "`" + db.Name + "`.`" + table + "`"
					want = []string{"lacks " + priv + " on " + quoted, "GRANT " + priv + " ON " + quoted + " TO 'g_less_"}
				} else {
					want = append(want, "GRANT "+priv+" ON *.* TO 'g_less_")
				}
				for _, w := range want {
					if !strings.Contains(line, w) {
						t.Errorf("error line %q does not contain %q", line, w)
					}
				}
				if code != 2 {
					t.Errorf("exit code %d, want 2; last line %q", code, line)
				}
			})
		}
	}
}

// limitedInbox is a dedup.Consumer running as the inbox role's user on a
// queue of its own. Its handler records an effect per message and fails,
// every time, the first message of producer 0, which it gives up on after
// two attempts.
type limitedInbox struct {
	c       *dedup.Consumer
	effects *sql.DB
	failing atomic.Int64
}

func startLimitedInbox(ctx context.Context, t *testing.T, db *testenv.DB, b *testenv.Broker, dsn string) *limitedInbox {
	t.Helper()
	// The handler's business table: the application grants it.
	opsExec(t, db, "CREATE TABLE inbox_effects (message_id CHAR(36) NOT NULL PRIMARY KEY)")
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	opsExec(t, db, fmt.Sprintf("GRANT INSERT ON `%s`.inbox_effects TO '%s'@'%%'", db.Name, cfg.User))
	queue := b.DeclareQueue(t, "#")
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	in := &limitedInbox{effects: db.SQL}
	effect := func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error {
		if d.Headers["producer"] == int64(0) && d.Headers["seq"] == int64(0) {
			in.failing.Add(1)
			return errors.New("this message always fails")
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO inbox_effects (message_id) VALUES (?)", d.MessageId)
		return err
	}
	in.c = &dedup.Consumer{
		Inbox: dedup.New(openAs(t, dsn), "grants-test"), Queue: queue,
		Unknown: effect, MaxAttempts: 2, RetryDelay: 10 * time.Millisecond, Workers: 2,
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- in.c.Run(runCtx, ch) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("inbox consumer: %v", err)
		}
		conn.Close()
	})
	return in
}

// wait waits until the consumer has processed processed messages and given
// up on failed, and checks one effect per processed message.
func (in *limitedInbox) wait(ctx context.Context, t *testing.T, processed, failed int64) {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	for {
		st := in.c.Stats()
		if st.Processed >= processed && st.Failed >= failed {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("inbox consumer as the inbox role: %+v, want %d processed and %d failed", st, processed, failed)
		case <-time.After(50 * time.Millisecond):
		}
	}
	var n int64
	if err := in.effects.QueryRowContext(ctx, "SELECT COUNT(*) FROM inbox_effects").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if st := in.c.Stats(); n != processed || st.Processed != processed || st.Failed != failed || in.failing.Load() != 2 {
		t.Fatalf("inbox consumer: %d effects, stats %+v, %d attempts of the failing message; want %d effects, %d failed after 2 attempts",
			n, st, in.failing.Load(), processed, failed)
	}
}
