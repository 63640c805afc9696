package main

// Tests of the failed command as a subprocess against a real database, and
// of a retried message going through a real relay to a real broker.

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// opsDB is a migrated database for an operator command test.
func opsDB(t *testing.T, extra ...string) *testenv.DB {
	t.Helper()
	db := testenv.MySQL(t)
	if r := runBinary(t, relayBinary(t), nil, append([]string{"migrate", "--mysql-dsn", db.DSN}, extra...)...); r.code != 0 {
		t.Fatalf("migrate: %+v", r)
	}
	return db
}

// ops runs an operator command against db.
func ops(t *testing.T, db *testenv.DB, args ...string) result {
	t.Helper()
	return runBinary(t, relayBinary(t), []string{"OUTBOX_RELAY_MYSQL_DSN=" + db.DSN, "OUTBOX_RELAY_LOG_FORMAT=console"}, args...)
}

func opsExec(t *testing.T, db *testenv.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.SQL.Exec(query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func opsCount(t *testing.T, db *testenv.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.SQL.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func newMessageID(t *testing.T) uuid.UUID {
	t.Helper()
	u, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// opsFailed records a failed message in outbox_failed as the relay does.
func opsFailed(t *testing.T, db *testenv.DB, outboxID int, id uuid.UUID, key, exchange, headers, payload, source string, failedAgo time.Duration) {
	t.Helper()
	var h any
	if headers != "" {
		h = headers
	}
	opsExec(t, db, `INSERT INTO outbox_failed (outbox_id, message_id, partition_key, exchange, routing_key, message_type,
		headers, payload, content_type, created_at, error, source, failed_at)
		VALUES (?, ?, ?, ?, 'order.paid', 'order.paid', ?, ?, 'application/json', UTC_TIMESTAMP(6) - INTERVAL 1 DAY,
		'exchange "x" not found', ?, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)`,
		outboxID, id[:], key, exchange, h, payload, source, failedAgo.Microseconds())
}

// failed list, show, retry and purge: tables for people, --json for
// scripts, --dry-run changing nothing, and exit code 2 with a one-line
// message for what is refused (a bad id, an unknown message or row, a
// message already retried, the zero message id, a missing or malformed age,
// an unknown subcommand). Purge by ID deletes exactly the failures named.
func TestCLIFailed(t *testing.T) {
	db := opsDB(t)
	m1, m2, m3 := newMessageID(t), newMessageID(t), newMessageID(t)
	opsFailed(t, db, 11, m1, "order-1", "orders", `{"tenant": "t1"}`, `{"n":1}`, "relay", 10*24*time.Hour)
	opsFailed(t, db, 12, m2, "order-2", "", "", `{"n":2}`, "inbox", time.Hour)
	opsFailed(t, db, 13, m3, "order-3", "", "", `{"n":3}`, "relay", time.Minute)

	r := ops(t, db, "failed", "list")
	if r.code != 0 || !strings.Contains(r.stdout, "MESSAGE ID") || !strings.Contains(r.stdout, m1.String()) ||
		!strings.Contains(r.stdout, `exchange "x" not found`) || !strings.Contains(r.stdout, "3 failed messages") {
		t.Fatalf("failed list: %+v", r)
	}
	r = ops(t, db, "failed", "list", "--json", "--limit", "1", "--source", "relay")
	var list struct {
		Total    int `json:"total"`
		Messages []struct {
			MessageID string `json:"message_id"`
			OutboxID  uint64 `json:"outbox_id"`
			Source    string `json:"source"`
			Error     string `json:"error"`
			FailedAt  string `json:"failed_at"`
		} `json:"messages"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil || list.Total != 2 || len(list.Messages) != 1 ||
		list.Messages[0].MessageID != m3.String() || list.Messages[0].Source != "relay" || list.Messages[0].FailedAt == "" {
		t.Fatalf("failed list --json --limit 1 --source relay: %+v\n%+v", r, list)
	}
	if r = ops(t, db, "failed", "list", "--source", "broker"); r.code != 2 || !strings.Contains(r.stderr, "broker") {
		t.Fatalf("failed list --source broker: %+v", r)
	}

	r = ops(t, db, "failed", "show", m1.String())
	if r.code != 0 || !strings.Contains(r.stdout, "order-1") || !strings.Contains(r.stdout, `{"tenant": "t1"}`) || !strings.Contains(r.stdout, `{"n":1}`) {
		t.Fatalf("failed show: %+v", r)
	}
	var shown struct {
		MessageID string `json:"message_id"`
		Failures  []struct {
			Headers       map[string]any `json:"headers"`
			Payload       *string        `json:"payload"`
			PayloadBase64 string         `json:"payload_base64"`
			Exchange      string         `json:"exchange"`
		} `json:"failures"`
	}
	r = ops(t, db, "failed", "show", "--json", strings.ToUpper(m1.String()))
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &shown) != nil || shown.MessageID != m1.String() || len(shown.Failures) != 1 ||
		shown.Failures[0].Headers["tenant"] != "t1" || shown.Failures[0].Payload == nil || *shown.Failures[0].Payload != `{"n":1}` ||
		shown.Failures[0].PayloadBase64 != "eyJuIjoxfQ==" || shown.Failures[0].Exchange != "orders" {
		t.Fatalf("failed show --json: %+v\n%+v", r, shown)
	}
	for _, args := range [][]string{
		{"failed", "show", "not-a-uuid"},
		{"failed", "show", newMessageID(t).String()},
		{"failed", "show"},
		{"failed", "show", m1.String(), m2.String()},
		{"failed", "retry"},
		{"failed", "retry", "--all", m1.String()},
		{"failed", "retry", m1.String(), "12345"},
		{"failed", "purge"},
		{"failed", "purge", "--older-than", "7 days"},
		{"failed", "purge", "--older-than", "-1d"},
		{"failed", "resend"},
		{"failed"},
	} {
		if r := ops(t, db, args...); r.code != 2 || strings.Count(r.stderr, "outbox-relay: ") != 1 {
			t.Errorf("%q: %+v; want exit 2 with one error line", args, r)
		}
	}
	if n := opsCount(t, db, "SELECT COUNT(*) FROM outbox_failed"); n != 3 {
		t.Fatalf("%d failed rows left after refused commands, want 3", n)
	}

	// Retry: the dry run says what would happen and changes nothing.
	r = ops(t, db, "failed", "retry", "--dry-run", m1.String(), m2.String())
	if r.code != 0 || !strings.Contains(r.stdout, "would retry "+m1.String()) || !strings.Contains(r.stdout, "would retry "+m2.String()) ||
		opsCount(t, db, "SELECT COUNT(*) FROM outbox") != 0 || opsCount(t, db, "SELECT COUNT(*) FROM outbox_failed") != 3 {
		t.Fatalf("failed retry --dry-run: %+v", r)
	}
	r = ops(t, db, "failed", "retry", m1.String(), "--json") // flags after ids are read too
	var retried struct {
		DryRun  bool `json:"dry_run"`
		Retried []struct {
			MessageID string `json:"message_id"`
			OutboxID  uint64 `json:"outbox_id"`
		} `json:"retried"`
		Skipped []any `json:"skipped"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &retried) != nil || retried.DryRun || len(retried.Retried) != 1 ||
		retried.Retried[0].MessageID != m1.String() || len(retried.Skipped) != 0 {
		t.Fatalf("failed retry --json: %+v\n%+v", r, retried)
	}
	if n := opsCount(t, db, "SELECT COUNT(*) FROM outbox WHERE message_id = ? AND id = ? AND delivered_at IS NULL",
		m1[:], retried.Retried[0].OutboxID); n != 1 {
		t.Fatalf("retried message not pending in the outbox as id %d", retried.Retried[0].OutboxID)
	}
	// Again: the message is no longer a failed one. Refused, nothing changes.
	r = ops(t, db, "failed", "retry", m1.String(), m2.String())
	if r.code != 2 || !strings.Contains(r.stdout, m1.String()) || !strings.Contains(r.stderr, "nothing was changed") ||
		opsCount(t, db, "SELECT COUNT(*) FROM outbox") != 1 || opsCount(t, db, "SELECT COUNT(*) FROM outbox_failed") != 2 {
		t.Fatalf("second retry: %+v", r)
	}

	// Purge by ID: exactly the failures named, all or nothing.
	opsFailed(t, db, 14, uuid.Nil, "", "", "", `{"n":4}`, "inbox", time.Second) // its message id was not a UUID
	row := opsCount(t, db, "SELECT id FROM outbox_failed WHERE message_id = ?", uuid.Nil[:])
	for _, args := range [][]string{
		{"failed", "purge", fmt.Sprint(row), "999999"},
		{"failed", "purge", fmt.Sprint(row), "--older-than", "1d"},
		{"failed", "purge", uuid.Nil.String()},
	} {
		if r := ops(t, db, args...); r.code != 2 || strings.Count(r.stderr, "outbox-relay: ") != 1 {
			t.Errorf("%q: %+v; want exit 2 with one error line", args, r)
		}
	}
	r = ops(t, db, "failed", "purge", fmt.Sprint(row), "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("would purge failed row %d (message (not a UUID)", row)) ||
		opsCount(t, db, "SELECT COUNT(*) FROM outbox_failed") != 3 {
		t.Fatalf("failed purge %d --dry-run: %+v", row, r)
	}
	r = ops(t, db, "failed", "purge", fmt.Sprint(row), "--json")
	var purgedIDs struct {
		Rows   int `json:"rows"`
		Purged []struct {
			RowID     int     `json:"row_id"`
			MessageID *string `json:"message_id"`
		} `json:"purged"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &purgedIDs) != nil || purgedIDs.Rows != 1 || purgedIDs.Purged[0].RowID != row ||
		purgedIDs.Purged[0].MessageID != nil || opsCount(t, db, "SELECT COUNT(*) FROM outbox_failed") != 2 {
		t.Fatalf("failed purge %d --json: %+v", row, r)
	}

	// Purge: only failures older than the age, 7d being 7 days.
	r = ops(t, db, "failed", "purge", "--older-than", "30m", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "would purge 1 ") || opsCount(t, db, "SELECT COUNT(*) FROM outbox_failed") != 2 {
		t.Fatalf("failed purge --dry-run: %+v", r)
	}
	r = ops(t, db, "failed", "purge", "--older-than", "7d")
	if r.code != 0 || !strings.Contains(r.stdout, "purged 0 ") {
		t.Fatalf("failed purge --older-than 7d: %+v", r)
	}
	r = ops(t, db, "failed", "purge", "--older-than", "30m", "--json")
	var purged struct {
		Rows   int64  `json:"rows"`
		Cutoff string `json:"cutoff"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &purged) != nil || purged.Rows != 1 || purged.Cutoff == "" ||
		opsCount(t, db, "SELECT COUNT(*) FROM outbox_failed WHERE message_id = ?", m3[:]) != 1 {
		t.Fatalf("failed purge --json: %+v", r)
	}
}

// delivery is one message as a consumer received it.
type delivery struct {
	id, key string
	headers amqp.Table
	body    string
}

// collect consumes queue and returns a function giving what arrived so far.
func collect(t *testing.T, url, queue string) func() []delivery {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		got []delivery
	)
	go func() {
		for d := range ds {
			key, _ := d.Headers["x-partition-key"].(string)
			mu.Lock()
			got = append(got, delivery{d.MessageId, key, d.Headers, string(d.Body)})
			mu.Unlock()
		}
	}()
	return func() []delivery {
		mu.Lock()
		defer mu.Unlock()
		return append([]delivery(nil), got...)
	}
}

// A message that failed (its exchange was missing) and is retried once the
// exchange exists reaches the consumer with its message id, headers and
// payload, after the rows of its partition key that were already waiting
// and before the one enqueued after the retry.
func TestCLIFailedRetryIsDeliveredInOrder(t *testing.T) {
	ctx := testenv.WorkContext(t)
	db := opsDB(t)
	b := testenv.RabbitMQ(t)
	got := collect(t, b.URL, b.Queue)
	failedID := newMessageID(t)
	opsFailed(t, db, 1, failedID, "order-1", b.Exchange, `{"tenant": "t1"}`, `{"n":0}`, "relay", time.Hour)
	var want []string
	for i := 1; i <= 2; i++ {
		id := newMessageID(t)
		opsExec(t, db, "INSERT INTO outbox (message_id, partition_key, routing_key, payload) VALUES (?, 'order-1', 'order.paid', ?)",
			id[:], fmt.Sprintf(`{"n":%d}`, i))
		want = append(want, id.String())
	}
	if r := ops(t, db, "failed", "retry", failedID.String()); r.code != 0 {
		t.Fatalf("failed retry: %+v", r)
	}
	want = append(want, failedID.String())
	last := newMessageID(t)
	opsExec(t, db, "INSERT INTO outbox (message_id, partition_key, routing_key, payload) VALUES (?, 'order-1', 'order.paid', '{\"n\":3}')", last[:])
	want = append(want, last.String())

	relay := newRelayProc(t, relayArgs(t, db, b, "--mode", "poll")...)
	relay.start()
	if err := progress.Wait(ctx, "deliveries", func() int64 { return int64(len(got())) }, func() bool {
		if !relay.running() {
			t.Fatalf("relay exited after %d deliveries", len(got()))
		}
		return len(got()) >= len(want)
	}); err != nil {
		t.Fatalf("%d deliveries of %d: %v", len(got()), len(want), err)
	}
	ds := got()
	for i, d := range ds {
		if i >= len(want) || d.id != want[i] || d.key != "order-1" {
			t.Fatalf("delivery %d: %s (key %q), want %v in that order", i, d.id, d.key, want)
		}
	}
	if d := ds[2]; d.headers["tenant"] != "t1" || d.body != `{"n":0}` {
		t.Fatalf("retried message: headers %v, body %q", d.headers, d.body)
	}
	if code, _ := relay.terminate(30 * time.Second); code != 0 {
		t.Fatalf("relay exit code %d", code)
	}
	if n := opsCount(t, db, "SELECT COUNT(*) FROM outbox_failed"); n != 0 {
		t.Fatalf("%d rows in outbox_failed", n)
	}
}

// A row that cannot be published (headers not a JSON object) and one whose
// exchange does not exist go to outbox_failed with the same reason, and
// each gets a log line naming its message id, whether the relay polls or
// reads the binlog.
func TestCLIFailedRowsSameInBothModes(t *testing.T) {
	ctx := testenv.WorkContext(t)
	reasons := map[string][2]string{}
	for _, mode := range []string{"poll", "binlog"} {
		db := opsDB(t)
		b := testenv.RabbitMQ(t)
		relay := newRelayProc(t, relayArgs(t, db, b, "--mode", mode)...)
		relay.start()
		if mode == "binlog" {
			relay.waitLog(ctx, "tailing the binlog") // the rows below come from the stream, not the first sweep
		} else {
			relay.waitLog(ctx, "polling the outbox table")
		}
		bad, missing := newMessageID(t), newMessageID(t)
		opsExec(t, db, "INSERT INTO outbox (message_id, partition_key, routing_key, headers, payload) VALUES (?, 'a', 'rk', '[1, 2]', '{}')", bad[:])
		opsExec(t, db, "INSERT INTO outbox (message_id, partition_key, exchange, routing_key, payload) VALUES (?, 'b', 'no-such-exchange-h6', 'rk', '{}')", missing[:])
		if err := progress.Wait(ctx, "rows in outbox_failed", nil, func() bool {
			if !relay.running() {
				t.Fatalf("%s: relay exited", mode)
			}
			return opsCount(t, db, "SELECT COUNT(*) FROM outbox_failed") >= 2
		}); err != nil {
			t.Fatalf("%s: the rows never reached outbox_failed: %v", mode, err)
		}
		if code, _ := relay.terminate(30 * time.Second); code != 0 {
			t.Fatalf("%s: relay exit code %d", mode, code)
		}
		var r [2]string
		for i, id := range []uuid.UUID{bad, missing} {
			if err := db.SQL.QueryRow("SELECT error FROM outbox_failed WHERE message_id = ?", id[:]).Scan(&r[i]); err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			line := grepLines(relay.output(), id.String())
			if !strings.Contains(line, "outbox_failed") {
				t.Errorf("%s: no log line naming message %s and outbox_failed:\n%s", mode, id, relay.output())
			}
		}
		reasons[mode] = r
	}
	if reasons["poll"] != reasons["binlog"] {
		t.Fatalf("reasons differ:\npoll   %q\nbinlog %q", reasons["poll"], reasons["binlog"])
	}
	if !strings.Contains(reasons["poll"][0], "not a JSON object") && !strings.Contains(reasons["poll"][0], "object") {
		t.Errorf("reason for headers [1, 2]: %q", reasons["poll"][0])
	}
	if !strings.Contains(reasons["poll"][1], "exchange not found") {
		t.Errorf("reason for a missing exchange: %q", reasons["poll"][1])
	}
}

// uuidRE finds message ids in the commands' output.
var uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// publishRaw publishes messages with the given AMQP message ids straight to
// the broker, as a producer that does not use the outbox might.
func publishRaw(ctx context.Context, t *testing.T, b *testenv.Broker, key string, ids ...string) {
	t.Helper()
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := ch.PublishWithContext(ctx, b.Exchange, "order.paid", false, false, amqp.Publishing{
			MessageId: id, Type: "order.paid", ContentType: "application/json", DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{"x-partition-key": key, "tenant": "t1"}, Body: []byte(`{"payload of":"` + id + `"}`),
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitCount waits until query returns n.
func waitCount(ctx context.Context, t *testing.T, db *testenv.DB, n int, query string) {
	t.Helper()
	// progress.Wait asks measure before done: done reads what it counted.
	got := -1
	count := func() int64 { got = opsCount(t, db, query); return int64(got) }
	if err := progress.Wait(ctx, query, count, func() bool { return got == n }); err != nil {
		t.Fatalf("%s: %d, waited for %d: %v", query, got, n, err)
	}
}

// Messages whose AMQP message ids are a, b, c and d (not UUIDs) reach an
// inbox consumer, which moves them to outbox_failed (message id zeros).
// `failed list` names them by row id; `failed show` and `failed retry` take
// the row id, and refuse the zero message id. d is retried by its row id,
// then `failed retry --all` puts back the other three: each goes back under
// a new UUIDv7 the command prints. The relay publishes them with their
// payloads, headers and partition key, in the order they were retried, and
// the inbox processes each one: none is lost, none is taken for a
// duplicate of another.
func TestCLIFailedRetryWithoutUUID(t *testing.T) {
	ctx := testenv.WorkContext(t)
	db := opsDB(t)
	b := testenv.RabbitMQ(t)
	inbox := startInboxEffects(ctx, t, db, b, b.Queue)
	payload := func(id string) string { return `{"payload of":"` + id + `"}` }
	for i, id := range []string{"a", "b", "c", "d"} {
		publishRaw(ctx, t, b, "order-1", id)
		waitCount(ctx, t, db, i+1, "SELECT COUNT(*) FROM outbox_failed") // one at a time: the order they failed in
	}
	v := validator.New()
	stop, err := validator.Consume(ctx, b.URL, b.DeclareQueue(t, "order.#"), v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	var list struct {
		Messages []struct {
			RowID     uint64  `json:"row_id"`
			MessageID *string `json:"message_id"`
		} `json:"messages"`
	}
	r := ops(t, db, "failed", "list", "--json")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list.Messages) != 4 {
		t.Fatalf("failed list --json: %+v", r)
	}
	rowD := list.Messages[0].RowID // newest first
	for _, m := range list.Messages {
		if m.MessageID != nil || m.RowID == 0 {
			t.Fatalf("failed list --json: %s; want row ids and a null message id", r.stdout)
		}
	}
	if r := ops(t, db, "failed", "list"); r.code != 0 || !strings.Contains(r.stdout, "ROW ID") || !strings.Contains(r.stdout, "(not a UUID)") {
		t.Fatalf("failed list: %+v", r)
	}
	if r := ops(t, db, "failed", "show", "00000000-0000-0000-0000-000000000000"); r.code != 2 || !strings.Contains(r.stderr, "row id") {
		t.Fatalf("failed show of the zero id: %+v; want exit 2 pointing at row ids", r)
	}
	if r := ops(t, db, "failed", "show", fmt.Sprint(rowD)); r.code != 0 || !strings.Contains(r.stdout, payload("d")) {
		t.Fatalf("failed show %d: %+v", rowD, r)
	}
	r = ops(t, db, "failed", "retry", fmt.Sprint(rowD))
	printedD := uuidRE.FindAllString(r.stdout, -1)
	if r.code != 0 || len(printedD) != 1 {
		t.Fatalf("failed retry %d: %+v; want the new message id printed", rowD, r)
	}

	r = ops(t, db, "failed", "retry", "--all")
	printed := append(printedD, uuidRE.FindAllString(r.stdout, -1)...)
	got := outboxPayloads(t, db)
	if r.code != 0 || len(printed) != 4 || len(got) != 4 {
		t.Fatalf("failed retry --all: %+v\noutbox: %v\nwant a, b and c retried after d, four new ids in all", r, got)
	}
	var want []validator.Expected
	for i, id := range []string{"d", "a", "b", "c"} {
		mid, err := outbox.ParseMessageID(printed[i])
		if err != nil || uuid.UUID(mid).Version() != 7 || got[i] != [2]string{printed[i], payload(id)} {
			t.Fatalf("outbox row %d: %v, printed id %s; want message %s under a new UUIDv7\n%s", i, got[i], printed[i], id, r.stdout)
		}
		want = append(want, validator.Expected{ID: mid, PartitionKey: "order-1", Exchange: b.Exchange, RoutingKey: "order.paid",
			MessageType: "order.paid", ContentType: "application/json", Payload: []byte(got[i][1]), Headers: map[string]any{"tenant": "t1"}})
	}
	if len(slices.Compact(sorted(printed))) != 4 {
		t.Fatalf("the retried messages share an id: %v", printed)
	}
	if r := ops(t, db, "failed", "list"); r.code != 0 || !strings.Contains(r.stdout, "no failed messages") {
		t.Fatalf("failed list after the retry: %+v", r)
	}
	v.Expect(want...)

	relay := newRelayProc(t, relayArgs(t, db, b, "--mode", "poll")...)
	relay.start()
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := progress.Wait(ctx, "retried messages through the inbox", func() int64 { return inbox.c.Stats().Processed },
		func() bool { return inbox.c.Stats().Processed >= 4 }); err != nil {
		t.Fatalf("the inbox processed %d of the 4 retried messages: %+v: %v", inbox.c.Stats().Processed, inbox.c.Stats(), err)
	}
	if code, _ := relay.terminate(30 * time.Second); code != 0 {
		t.Fatalf("relay exit code %d", code)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	if effects := inboxEffectIDs(t, db); !slices.Equal(effects, sorted(printed)) {
		t.Fatalf("the inbox ran its handler for %v, want once for each of %v", effects, printed)
	}
}

// outboxPayloads returns the outbox's rows in id order: message id, payload.
func outboxPayloads(t *testing.T, db *testenv.DB) [][2]string {
	t.Helper()
	rows, err := db.SQL.Query("SELECT message_id, payload FROM outbox ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out [][2]string
	for rows.Next() {
		var raw, payload []byte
		if err := rows.Scan(&raw, &payload); err != nil {
			t.Fatal(err)
		}
		var id outbox.MessageID
		copy(id[:], raw)
		out = append(out, [2]string{id.String(), string(payload)})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// inboxEffectIDs returns the message ids the inbox consumer's handler ran
// for (startInboxEffects), sorted.
func inboxEffectIDs(t *testing.T, db *testenv.DB) []string {
	t.Helper()
	rows, err := db.SQL.Query("SELECT message_id FROM inbox_effects ORDER BY message_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
