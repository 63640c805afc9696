package maintenance_test

import (
	"bytes"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/maintenance"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// List shows the newest failures first, filtered by source and cut at the
// limit with the total; show returns every failure of one message with its
// payload; purge deletes only failures older than its age.
func TestListShowPurgeFailed(t *testing.T) {
	db, ctx := setup(t, false)
	m1, m2 := newID(t), newID(t)
	insertFailed(t, db, failedRow{outboxID: 1, id: m1, key: "k", rk: "a", payload: []byte("one"), failedAgo: 10 * day})
	insertFailed(t, db, failedRow{outboxID: 7, id: m2, rk: "b", payload: []byte("two"), source: "inbox", failedAgo: day})
	insertFailed(t, db, failedRow{outboxID: 9, id: m1, key: "k", rk: "a", payload: []byte("one"), failedAgo: time.Hour})

	list, total, err := maintenance.ListFailed(ctx, db, maintenance.ListOptions{})
	if err != nil || total != 3 || len(list) != 3 {
		t.Fatalf("list: %d of %d, %v", len(list), total, err)
	}
	if list[0].OutboxID != 9 || list[1].OutboxID != 7 || list[2].OutboxID != 1 || list[0].Payload != nil || list[0].PayloadBytes != 3 {
		t.Fatalf("list is not newest first without payloads: %+v", list)
	}
	if list, total, err = maintenance.ListFailed(ctx, db, maintenance.ListOptions{Source: "inbox"}); err != nil || total != 1 || list[0].MessageID != m2 {
		t.Fatalf("list --source inbox: %+v of %d, %v", list, total, err)
	}
	if list, total, err = maintenance.ListFailed(ctx, db, maintenance.ListOptions{Limit: 1}); err != nil || total != 3 || len(list) != 1 {
		t.Fatalf("list --limit 1: %d of %d, %v", len(list), total, err)
	}
	if _, _, err = maintenance.ListFailed(ctx, db, maintenance.ListOptions{Source: "broker"}); !maintenance.IsRefused(err) {
		t.Fatalf("unknown source: %v", err)
	}

	shown, err := maintenance.ShowFailed(ctx, db, m1)
	if err != nil || len(shown) != 2 || string(shown[0].Payload) != "one" || shown[0].OutboxID != 1 || shown[1].OutboxID != 9 {
		t.Fatalf("show: %+v, %v", shown, err)
	}
	if _, err := maintenance.ShowFailed(ctx, db, newID(t)); !maintenance.IsRefused(err) {
		t.Fatalf("show of an unknown message: %v", err)
	}

	res, err := maintenance.PurgeFailed(ctx, db, maintenance.PurgeOptions{OlderThan: 7 * day, DryRun: true})
	if err != nil || res.Rows != 1 || count(t, db, "SELECT COUNT(*) FROM outbox_failed") != 3 {
		t.Fatalf("purge dry run: %+v, %v", res, err)
	}
	res, err = maintenance.PurgeFailed(ctx, db, maintenance.PurgeOptions{OlderThan: 7 * day})
	if err != nil || res.Rows != 1 || count(t, db, "SELECT COUNT(*) FROM outbox_failed WHERE outbox_id IN (7, 9)") != 2 ||
		count(t, db, "SELECT COUNT(*) FROM outbox_failed") != 2 {
		t.Fatalf("purge: %+v, %v", res, err)
	}
}

// outboxRow is a row of the outbox as a retry writes it.
type outboxRow struct {
	id                              uint64
	key, exchange, rk, mt, ct       string
	headers                         sql.NullString
	payload                         []byte
	available, delivered, lastError sql.NullString
	attempts                        int
	createdAgo                      float64 // seconds
}

func readOutbox(t *testing.T, db *sql.DB, id outbox.MessageID) []outboxRow {
	t.Helper()
	rows, err := db.Query(`SELECT id, partition_key, exchange, routing_key, message_type, content_type, headers, payload,
		available_at, delivered_at, last_error, attempts, TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) / 1e6
		FROM outbox WHERE message_id = ? ORDER BY id`, id[:])
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		if err := rows.Scan(&r.id, &r.key, &r.exchange, &r.rk, &r.mt, &r.ct, &r.headers, &r.payload,
			&r.available, &r.delivered, &r.lastError, &r.attempts, &r.createdAgo); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A retried message goes back into the outbox with its message id and
// every column it was enqueued with (binary payload, headers, type, content
// type), pending, available at once, with no attempts; its failed rows (it
// failed twice: copies of one message) are gone. It gets a new id: after
// the rows of its partition key already in the outbox, before the ones
// enqueued after the retry.
func TestRetryKeepsMessageAndLandsAfterEarlierRowsOfItsKey(t *testing.T) {
	db, ctx := setup(t, false)
	a1 := insertRow(t, db, "order-1", time.Minute, -1)
	a2 := insertRow(t, db, "order-1", time.Minute, -1)
	m := newID(t)
	payload := []byte{0, 1, 2, 0xff, 'x', 0}
	f := failedRow{outboxID: a1 - 1, id: m, key: "order-1", exchange: "orders", rk: "order.paid", mt: "order.paid",
		headers: `{"n":3,"tenant":"t1"}`, payload: payload, contentType: "application/octet-stream", source: "inbox", failedAgo: 2 * time.Hour}
	insertFailed(t, db, f)
	// The same message failing again (the inbox wrote its headers in
	// another form): a copy.
	f.failedAgo, f.headers, f.source = time.Hour, `{"tenant": "t1", "n": 3}`, "relay"
	insertFailed(t, db, f)

	res, err := maintenance.Retry(ctx, db, maintenance.RetryOptions{IDs: []outbox.MessageID{m}})
	if err != nil || len(res.Retried) != 1 || len(res.Skipped) != 0 {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	r := res.Retried[0]
	if r.MessageID != m || len(r.RowIDs) != 2 || r.ReplacedDelivered || r.NewID <= a2 {
		t.Fatalf("retried %+v; want message %s, 2 failed rows, a new id after %d", r, m, a2)
	}
	got := readOutbox(t, db, m)
	if len(got) != 1 {
		t.Fatalf("outbox holds %d rows of the message, want 1", len(got))
	}
	g := got[0]
	if g.id != r.NewID || g.key != "order-1" || g.exchange != "orders" || g.rk != "order.paid" || g.mt != "order.paid" ||
		g.ct != "application/octet-stream" || !bytes.Equal(g.payload, payload) || g.headers.String != `{"tenant": "t1", "n": 3}` ||
		g.available.Valid || g.delivered.Valid || g.lastError.Valid || g.attempts != 0 || g.createdAgo > 60 {
		t.Fatalf("outbox row %+v", g)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM outbox_failed"); n != 0 {
		t.Fatalf("%d rows left in outbox_failed", n)
	}
	a3 := insertRow(t, db, "order-1", 0, -1)
	if order := ids(t, db, "partition_key = 'order-1'"); !slices.Equal(order, []uint64{a1, a2, r.NewID, a3}) {
		t.Fatalf("order of the key's rows %v, want %v", order, []uint64{a1, a2, r.NewID, a3})
	}
}

// Refusals: a message still pending in the outbox, or not in outbox_failed,
// fails the whole call and changes nothing; a dry run reports and changes
// nothing; a copy marked delivered (mark mode) is replaced; --all retries
// what it can, oldest outbox id first, and names the rest.
func TestRetryRefusalsDryRunAndAll(t *testing.T) {
	db, ctx := setup(t, false)
	pending, ok, marked, unknown := newID(t), newID(t), newID(t), newID(t)
	exec(t, db, "INSERT INTO outbox (message_id, routing_key, payload) VALUES (?, 'rk', 'p')", pending[:])
	exec(t, db, "INSERT INTO outbox (message_id, routing_key, payload, delivered_at) VALUES (?, 'rk', 'p', UTC_TIMESTAMP(6))", marked[:])
	insertFailed(t, db, failedRow{outboxID: 30, id: pending, rk: "rk"})
	insertFailed(t, db, failedRow{outboxID: 20, id: ok, rk: "rk"})
	insertFailed(t, db, failedRow{outboxID: 10, id: marked, rk: "rk"})
	before := count(t, db, "SELECT COUNT(*) FROM outbox")

	for _, c := range []struct {
		ids []outbox.MessageID
		bad outbox.MessageID
	}{{[]outbox.MessageID{ok, pending}, pending}, {[]outbox.MessageID{unknown, ok}, unknown}} {
		ids := c.ids
		res, err := maintenance.Retry(ctx, db, maintenance.RetryOptions{IDs: ids})
		if !maintenance.IsRefused(err) || len(res.Retried) != 0 || len(res.Skipped) != 1 || res.Skipped[0].MessageID != c.bad {
			t.Fatalf("retry %v: %+v, %v; want a refusal naming %s", ids, res, err, c.bad)
		}
		if count(t, db, "SELECT COUNT(*) FROM outbox") != before || count(t, db, "SELECT COUNT(*) FROM outbox_failed") != 3 {
			t.Fatalf("retry %v changed the tables", ids)
		}
	}

	res, err := maintenance.Retry(ctx, db, maintenance.RetryOptions{IDs: []outbox.MessageID{ok, marked}, DryRun: true})
	if err != nil || len(res.Retried) != 2 || res.Retried[0].NewID != 0 || !res.Retried[1].ReplacedDelivered {
		t.Fatalf("dry run: %+v, %v", res, err)
	}
	if count(t, db, "SELECT COUNT(*) FROM outbox") != before || count(t, db, "SELECT COUNT(*) FROM outbox_failed") != 3 {
		t.Fatal("the dry run changed the tables")
	}

	res, err = maintenance.Retry(ctx, db, maintenance.RetryOptions{All: true, BatchSize: 1})
	if !maintenance.IsRefused(err) || len(res.Retried) != 2 || len(res.Skipped) != 1 || res.Skipped[0].MessageID != pending {
		t.Fatalf("retry --all: %+v, %v; want 2 retried and %s skipped", res, err, pending)
	}
	if res.Retried[0].MessageID != marked || !res.Retried[0].ReplacedDelivered || res.Retried[1].MessageID != ok {
		t.Fatalf("retry --all: %+v; want %s (replacing its delivered copy), then %s", res.Retried, marked, ok)
	}
	if rows := readOutbox(t, db, marked); len(rows) != 1 || rows[0].delivered.Valid || rows[0].id != res.Retried[0].NewID {
		t.Fatalf("marked message after the retry: %+v", rows)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM outbox_failed WHERE message_id = ?", pending[:]); n != 1 ||
		count(t, db, "SELECT COUNT(*) FROM outbox_failed") != 1 {
		t.Fatalf("outbox_failed after --all: want only %s left", pending)
	}
}

// On a partitioned outbox, whose message_id is not unique, two retries of
// one message at the same moment put it back once: one retries, the other
// finds nothing left to retry.
func TestRetryConcurrentPartitioned(t *testing.T) {
	db, ctx := setup(t, true)
	for range 5 {
		m := newID(t)
		insertFailed(t, db, failedRow{outboxID: 1, id: m, rk: "rk"})
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			retried int
			errs    []error
		)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := maintenance.Retry(ctx, db, maintenance.RetryOptions{IDs: []outbox.MessageID{m}})
				mu.Lock()
				defer mu.Unlock()
				retried += len(res.Retried)
				if err != nil {
					errs = append(errs, err)
				}
			}()
		}
		wg.Wait()
		if retried != 1 || len(errs) != 1 || !maintenance.IsRefused(errs[0]) {
			t.Fatalf("two concurrent retries: %d retried, errors %v; want 1 and one refusal", retried, errs)
		}
		if rows := readOutbox(t, db, m); len(rows) != 1 {
			t.Fatalf("the outbox holds %d rows of the message, want 1", len(rows))
		}
		// A failed row of the message while it is pending again (the
		// uniqueness check here is the retry's own, not a key's): refused.
		insertFailed(t, db, failedRow{outboxID: 2, id: m, rk: "rk"})
		res, err := maintenance.Retry(ctx, db, maintenance.RetryOptions{IDs: []outbox.MessageID{m}})
		if !maintenance.IsRefused(err) || len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0].Reason, "still pending") {
			t.Fatalf("retry of a pending message: %+v, %v", res, err)
		}
		exec(t, db, "DELETE FROM outbox_failed")
	}
}

// outboxMessage is an outbox row's message id and payload.
type outboxMessage struct {
	id      outbox.MessageID
	payload string
}

func (m outboxMessage) String() string { return m.id.String() + " " + strconv.Quote(m.payload) }

// outboxMessages returns the outbox's rows in id order.
func outboxMessages(t *testing.T, db *sql.DB) []outboxMessage {
	t.Helper()
	rows, err := db.Query("SELECT message_id, payload FROM outbox ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []outboxMessage
	for rows.Next() {
		var m outboxMessage
		var raw []byte
		if err := rows.Scan(&raw, &m.payload); err != nil {
			t.Fatal(err)
		}
		copy(m.id[:], raw)
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// isV7 reports whether id is a UUID of version 7 (RFC 9562 variant).
func isV7(id outbox.MessageID) bool { return id[6]>>4 == 7 && id[8]>>6 == 2 }

// Three inbox failures whose message ids were not UUIDs (a, b and c: the
// inbox stores each with the zero message id) are three messages: retry
// --all puts all three back, each under a new UUIDv7 of its own, in the
// order they failed, and outbox_failed ends empty.
func TestRetryAllFailuresWithoutUUID(t *testing.T) {
	db, ctx := setup(t, false)
	for i, p := range []string{"a", "b", "c"} {
		insertFailed(t, db, failedRow{outboxID: uint64(i + 1), key: "k", rk: "rk", payload: []byte("payload of " + p),
			source: "inbox", failedAgo: time.Duration(3-i) * time.Hour})
	}
	res, err := maintenance.Retry(ctx, db, maintenance.RetryOptions{All: true})
	got := outboxMessages(t, db)
	if err != nil || len(res.Retried) != 3 || len(got) != 3 {
		t.Fatalf("retry --all: %+v, %v; outbox %v; want 3 messages retried", res, err, got)
	}
	seen := map[outbox.MessageID]bool{}
	for i, p := range []string{"a", "b", "c"} {
		g := got[i]
		if r := res.Retried[i]; g.payload != "payload of "+p || !isV7(g.id) || seen[g.id] || r.MessageID != g.id || !r.NewMessageID || len(r.RowIDs) != 1 {
			t.Fatalf("outbox row %d: %s %q, retried %+v; want payload of %s under a new UUIDv7 of its own", i, g.id, g.payload, res.Retried[i], p)
		}
		seen[g.id] = true
	}
	if n := count(t, db, "SELECT COUNT(*) FROM outbox_failed"); n != 0 {
		t.Fatalf("%d rows left in outbox_failed", n)
	}
}

// Two failures under one UUID that differ (a producer gave two messages one
// id on a partitioned outbox, whose message_id is not unique) are not
// copies of one message: a retry by that id could put back only one of
// them, so it refuses and changes nothing.
func TestRetryRefusesDifferingFailuresOfOneID(t *testing.T) {
	db, ctx := setup(t, true)
	m := newID(t)
	insertFailed(t, db, failedRow{outboxID: 1, id: m, key: "k", rk: "rk", payload: []byte("first"), failedAgo: 2 * time.Hour})
	insertFailed(t, db, failedRow{outboxID: 2, id: m, key: "k", rk: "rk", payload: []byte("second"), failedAgo: time.Hour})
	for _, o := range []maintenance.RetryOptions{{IDs: []outbox.MessageID{m}}, {All: true}} {
		res, err := maintenance.Retry(ctx, db, o)
		if !maintenance.IsRefused(err) || len(res.Retried) != 0 || len(res.Skipped) != 1 {
			t.Fatalf("retry %+v: %+v, %v; want a refusal", o, res, err)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM outbox"); n != 0 || count(t, db, "SELECT COUNT(*) FROM outbox_failed") != 2 {
			t.Fatalf("retry %+v changed the tables: outbox %v", o, outboxMessages(t, db))
		}
	}
}

// failedRowID returns the id of the outbox_failed row holding payload.
func failedRowID(t *testing.T, db *sql.DB, payload string) uint64 {
	t.Helper()
	var id uint64
	if err := db.QueryRow("SELECT id FROM outbox_failed WHERE payload = ?", payload).Scan(&id); err != nil {
		t.Fatalf("failed row of %q: %v", payload, err)
	}
	return id
}

// A row id names one failure: a failure without a UUID goes back under a
// new UUIDv7 (none in a dry run), the others stay; one copy of a message
// that failed twice goes back and the other copy stays; of two messages
// under one id, the one named goes back under that id. The zero message id
// and a row id that is not there are refused and change nothing.
func TestRetryByRowID(t *testing.T) {
	db, ctx := setup(t, true)
	for _, p := range []string{"x", "y"} {
		insertFailed(t, db, failedRow{rk: "rk", payload: []byte(p), source: "inbox"})
	}
	twice, clash := newID(t), newID(t)
	insertFailed(t, db, failedRow{outboxID: 5, id: twice, rk: "rk", payload: []byte("twice"), failedAgo: time.Hour})
	insertFailed(t, db, failedRow{outboxID: 5, id: twice, rk: "rk", payload: []byte("twice"), source: "inbox"})
	insertFailed(t, db, failedRow{outboxID: 6, id: clash, rk: "rk", payload: []byte("one")})
	insertFailed(t, db, failedRow{outboxID: 7, id: clash, rk: "rk", payload: []byte("other")})
	x, y, other := failedRowID(t, db, "x"), failedRowID(t, db, "y"), failedRowID(t, db, "other")

	unchanged := func(what string) {
		t.Helper()
		if n := count(t, db, "SELECT COUNT(*) FROM outbox"); n != 0 || count(t, db, "SELECT COUNT(*) FROM outbox_failed") != 6 {
			t.Fatalf("%s changed the tables: outbox %v", what, outboxMessages(t, db))
		}
	}
	for _, o := range []maintenance.RetryOptions{
		{IDs: []outbox.MessageID{{}}},
		{RowIDs: []uint64{x, 1 << 40}},
		{IDs: []outbox.MessageID{clash}, RowIDs: []uint64{x}}, // the failures of clash differ
	} {
		if res, err := maintenance.Retry(ctx, db, o); !maintenance.IsRefused(err) || len(res.Retried) != 0 {
			t.Fatalf("retry %+v: %+v, %v; want a refusal", o, res, err)
		}
		unchanged(fmt.Sprintf("a refused retry %+v", o))
	}
	if _, err := maintenance.ShowFailed(ctx, db, outbox.MessageID{}); !maintenance.IsRefused(err) {
		t.Fatalf("show of the zero id: %v; want a refusal", err)
	}
	if f, err := maintenance.ShowFailedRow(ctx, db, x); err != nil || string(f.Payload) != "x" || f.MessageID != (outbox.MessageID{}) {
		t.Fatalf("show row %d: %+v, %v", x, f, err)
	}
	res, err := maintenance.Retry(ctx, db, maintenance.RetryOptions{RowIDs: []uint64{x}, DryRun: true})
	if err != nil || len(res.Retried) != 1 || !res.Retried[0].NewMessageID || res.Retried[0].MessageID != (outbox.MessageID{}) {
		t.Fatalf("dry run: %+v, %v", res, err)
	}
	unchanged("the dry run")

	var copyRow uint64 // the older copy of twice
	if err := db.QueryRow("SELECT MIN(id) FROM outbox_failed WHERE message_id = ?", twice[:]).Scan(&copyRow); err != nil {
		t.Fatal(err)
	}
	res, err = maintenance.Retry(ctx, db, maintenance.RetryOptions{RowIDs: []uint64{x, copyRow, other}})
	if err != nil || len(res.Retried) != 3 {
		t.Fatalf("retry rows %d, %d and %d: %+v, %v", x, copyRow, other, res, err)
	}
	got := map[string]outbox.MessageID{}
	for _, m := range outboxMessages(t, db) {
		got[m.payload] = m.id
	}
	if len(got) != 3 || !isV7(got["x"]) || got["x"] != res.Retried[0].MessageID || got["twice"] != twice || got["other"] != clash {
		t.Fatalf("outbox %v, retried %+v; want x under a new UUIDv7, twice and other under their ids", outboxMessages(t, db), res.Retried)
	}
	if left := failedPayloads(t, db); !slices.Equal(left, []string{"y", "twice", "one"}) || count(t, db, "SELECT COUNT(*) FROM outbox_failed WHERE id = ?", y) != 1 {
		t.Fatalf("outbox_failed holds %q; want y, the other copy of twice and one", left)
	}
}

// failedPayloads returns the payloads in outbox_failed, in id order.
func failedPayloads(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query("SELECT payload FROM outbox_failed ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Purge by name deletes exactly the failures named (every failure of a
// message id, the one failure of a row id), all or nothing; its dry run
// lists them and deletes nothing.
func TestPurgeFailedIDs(t *testing.T) {
	db, ctx := setup(t, false)
	m, n := newID(t), newID(t)
	insertFailed(t, db, failedRow{id: m, rk: "rk", payload: []byte("m1")})
	insertFailed(t, db, failedRow{id: m, rk: "rk", payload: []byte("m2")})
	insertFailed(t, db, failedRow{rk: "rk", payload: []byte("x"), source: "inbox"})
	insertFailed(t, db, failedRow{rk: "rk", payload: []byte("y"), source: "inbox"})
	insertFailed(t, db, failedRow{id: n, rk: "rk", payload: []byte("n")})
	x := failedRowID(t, db, "x")
	all := []string{"m1", "m2", "x", "y", "n"}

	for _, o := range []maintenance.PurgeIDsOptions{
		{IDs: []outbox.MessageID{m}, RowIDs: []uint64{1 << 40}},
		{IDs: []outbox.MessageID{m, newID(t)}},
		{IDs: []outbox.MessageID{{}}},
		{},
	} {
		if list, err := maintenance.PurgeFailedIDs(ctx, db, o); !maintenance.IsRefused(err) || len(list) != 0 {
			t.Fatalf("purge %+v: %+v, %v; want a refusal", o, list, err)
		}
		if got := failedPayloads(t, db); !slices.Equal(got, all) {
			t.Fatalf("a refused purge %+v left %q", o, got)
		}
	}
	o := maintenance.PurgeIDsOptions{IDs: []outbox.MessageID{m}, RowIDs: []uint64{x}, DryRun: true}
	list, err := maintenance.PurgeFailedIDs(ctx, db, o)
	if err != nil || len(list) != 3 || list[2].RowID != x || !slices.Equal(failedPayloads(t, db), all) {
		t.Fatalf("dry run: %+v, %v", list, err)
	}
	o.DryRun = false
	if list, err = maintenance.PurgeFailedIDs(ctx, db, o); err != nil || len(list) != 3 {
		t.Fatalf("purge: %+v, %v", list, err)
	}
	if got := failedPayloads(t, db); !slices.Equal(got, []string{"y", "n"}) {
		t.Fatalf("purge of %s and row %d left %q, want y and n", m, x, got)
	}
}
