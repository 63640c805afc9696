package maintenance_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/maintenance"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// A seeded random mix of failures — messages whose id was not a UUID,
// single failures, copies of one message that failed more than once, two
// messages a producer gave one id, messages failing again after a retry —
// worked on by retries of random subsets, retry --all in random batch
// sizes, purges by age and by id, and deliveries by the relay (rows deleted or marked
// delivered). After every step no message is lost: a failed row that goes
// away was put back into the outbox (and the retry says so), or purged by
// a purge that was asked to purge it; a message put back is there once, under its own UUID or,
// when it had none, under a new UUIDv7 of its own; a refused retry changes
// nothing. OUTBOX_TEST_SEED=n repeats a run.
func TestRetryAndPurgeConserveMessages(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("OUTBOX_TEST_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("OUTBOX_TEST_SEED=%q: %v", s, err)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	partitioned := rng.IntN(2) == 0
	t.Logf("seed %d (OUTBOX_TEST_SEED=%d repeats this run), partitioned outbox: %v", seed, seed, partitioned)
	db, ctx := setup(t, partitioned)
	f := &fuzz{t: t, ctx: ctx, db: db, rng: rng, msgs: map[string]*fuzzMsg{},
		delivered: map[string]bool{}, purged: map[string]bool{}, newIDs: map[string]outbox.MessageID{}, tally: map[string]int{}}
	for round := range 4 {
		f.addFailures(8 + rng.IntN(8))
		f.check("after new failures")
		for range 10 {
			var step string
			before := f.read()
			switch p := rng.IntN(100); {
			case p < 45:
				step = f.retryIDs(before)
			case p < 55:
				step = f.retryAll()
			case p < 65:
				step = f.purgeAge(before)
			case p < 72:
				step = f.purgeIDs(before)
			default:
				step = f.deliver(before)
			}
			f.steps = append(f.steps, fmt.Sprintf("round %d: %s", round, step))
			f.check(step)
		}
	}
	// At the end everything retriable goes back: what stays is a message
	// still pending in the outbox or two messages under one id.
	f.deliverAll()
	res, err := maintenance.Retry(ctx, db, maintenance.RetryOptions{All: true})
	if err != nil && !maintenance.IsRefused(err) {
		t.Fatal(err)
	}
	f.check("final retry --all")
	t.Logf("%d messages, %d steps; final retry --all: %d retried, %d skipped; along the way: %v",
		len(f.msgs), len(f.steps), len(res.Retried), len(res.Skipped), f.tally)
}

// fuzzMsg is one message of the fuzz test: its payload is its identity in
// the test (unique), id its message id (zero: its id was not a UUID).
type fuzzMsg struct {
	payload string
	id      outbox.MessageID
	key     string
}

type fuzz struct {
	t         *testing.T
	ctx       context.Context
	db        *sql.DB
	rng       *rand.Rand
	msgs      map[string]*fuzzMsg         // by payload
	delivered map[string]bool             // payloads the "relay" delivered
	purged    map[string]bool             // payloads whose every failure was purged
	newIDs    map[string]outbox.MessageID // payload → the id a retry gave a message without a UUID
	steps     []string
	next      int
	tally     map[string]int // what the steps did, for the log
}

// fuzzRow is a row of outbox_failed or of the outbox.
type fuzzRow struct {
	id        uint64
	messageID outbox.MessageID
	payload   string
	delivered bool // outbox: marked delivered
	ageDays   int  // outbox_failed: whole days since failed_at
}

type fuzzTables struct {
	failed, outbox map[uint64]fuzzRow
}

func (f *fuzz) read() fuzzTables {
	f.t.Helper()
	tabs := fuzzTables{failed: map[uint64]fuzzRow{}, outbox: map[uint64]fuzzRow{}}
	for _, q := range []struct {
		query string
		into  map[uint64]fuzzRow
	}{
		{"SELECT id, message_id, payload, FALSE, TIMESTAMPDIFF(DAY, failed_at, UTC_TIMESTAMP(6)) FROM outbox_failed", tabs.failed},
		{"SELECT id, message_id, payload, delivered_at IS NOT NULL, 0 FROM outbox", tabs.outbox},
	} {
		rows, err := f.db.QueryContext(f.ctx, q.query)
		if err != nil {
			f.t.Fatal(err)
		}
		for rows.Next() {
			var r fuzzRow
			var raw []byte
			if err := rows.Scan(&r.id, &raw, &r.payload, &r.delivered, &r.ageDays); err != nil {
				f.t.Fatal(err)
			}
			copy(r.messageID[:], raw)
			q.into[r.id] = r
		}
		if err := rows.Err(); err != nil {
			f.t.Fatal(err)
		}
		rows.Close()
	}
	return tabs
}

// fail records one failure of m, failed ageDays days (and a few minutes)
// ago. Every failure of a message has the same columns but the source.
func (f *fuzz) fail(m *fuzzMsg, ageDays int) {
	source := "relay"
	if m.id == (outbox.MessageID{}) || f.rng.IntN(2) == 0 {
		source = "inbox"
	}
	insertFailed(f.t, f.db, failedRow{outboxID: uint64(f.rng.IntN(1000)), id: m.id, key: m.key, rk: "rk",
		payload: []byte(m.payload), source: source,
		failedAgo: time.Duration(ageDays)*24*time.Hour + time.Duration(f.rng.IntN(600))*time.Second})
}

func (f *fuzz) newMsg(id outbox.MessageID) *fuzzMsg {
	f.next++
	m := &fuzzMsg{payload: fmt.Sprintf("message %d", f.next), id: id, key: fmt.Sprintf("k%d", f.rng.IntN(4))}
	f.msgs[m.payload] = m
	return m
}

// addFailures records n new failures of random kinds.
func (f *fuzz) addFailures(n int) {
	for range n {
		age := 1 + f.rng.IntN(6)
		switch p := f.rng.IntN(100); {
		case p < 35: // an inbox failure of a message whose id was not a UUID
			f.fail(f.newMsg(outbox.MessageID{}), age)
		case p < 60:
			f.fail(f.newMsg(newID(f.t)), age)
		case p < 75: // failed more than once: identical copies
			m := f.newMsg(newID(f.t))
			for range 2 + f.rng.IntN(2) {
				f.fail(m, age)
			}
		case p < 88: // two messages under one id
			id := newID(f.t)
			f.fail(f.newMsg(id), age)
			f.fail(f.newMsg(id), 1+f.rng.IntN(6))
		default: // a message with a UUID that was retried and fails again
			var again []*fuzzMsg
			for _, m := range f.msgs {
				if m.id != (outbox.MessageID{}) && !f.purged[m.payload] {
					again = append(again, m)
				}
			}
			if len(again) == 0 {
				continue
			}
			slices.SortFunc(again, func(a, b *fuzzMsg) int { return cmpString(a.payload, b.payload) })
			f.fail(again[f.rng.IntN(len(again))], age)
		}
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sortedRows returns the rows of m in id order.
func sortedRows(m map[uint64]fuzzRow) []fuzzRow {
	out := make([]fuzzRow, 0, len(m))
	for _, r := range m {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b fuzzRow) int { return cmpUint(a.id, b.id) })
	return out
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// retryIDs retries one or two random failures, each named by its message id
// or its row id (a failure without a UUID: by row id; now and then by the
// zero id, which is refused).
func (f *fuzz) retryIDs(before fuzzTables) string {
	var (
		ids    []outbox.MessageID
		rowIDs []uint64
	)
	picked := sortedRows(before.failed)
	f.rng.Shuffle(len(picked), func(i, j int) { picked[i], picked[j] = picked[j], picked[i] })
	for _, r := range picked[:min(len(picked), 1+f.rng.IntN(2))] {
		switch {
		case r.messageID == (outbox.MessageID{}) && f.rng.IntN(20) == 0:
			ids = append(ids, r.messageID)
		case r.messageID == (outbox.MessageID{}) || f.rng.IntN(2) == 0:
			rowIDs = append(rowIDs, r.id)
		default:
			ids = append(ids, r.messageID)
		}
	}
	if len(ids)+len(rowIDs) == 0 {
		return "retry by id: nothing picked"
	}
	res, err := maintenance.Retry(f.ctx, f.db, maintenance.RetryOptions{IDs: ids, RowIDs: rowIDs})
	step := fmt.Sprintf("retry %v rows %v: %d retried, %v", ids, rowIDs, len(res.Retried), err)
	switch {
	case maintenance.IsRefused(err):
		if after := f.read(); !sameTables(before, after) {
			f.t.Fatalf("%s: a refused retry changed the tables\nsteps:\n%s", step, f.history())
		}
	case err != nil:
		f.t.Fatalf("%s", step)
	default:
		f.checkRetried(step, before, res)
	}
	f.count("retry by id", res, err)
	return step
}

// count tallies a retry's outcome.
func (f *fuzz) count(kind string, res maintenance.RetryResult, err error) {
	if maintenance.IsRefused(err) {
		f.tally[kind+": refused"]++
	}
	for _, r := range res.Retried {
		switch {
		case r.NewMessageID:
			f.tally[kind+": retried without a UUID"]++
		case len(r.RowIDs) > 1:
			f.tally[kind+": retried with copies"]++
		default:
			f.tally[kind+": retried"]++
		}
	}
}

func (f *fuzz) retryAll() string {
	before := f.read()
	batch := 1 + f.rng.IntN(5)
	res, err := maintenance.Retry(f.ctx, f.db, maintenance.RetryOptions{All: true, BatchSize: batch})
	step := fmt.Sprintf("retry --all (batch %d): %d retried, %d skipped, %v", batch, len(res.Retried), len(res.Skipped), err)
	if err != nil && !maintenance.IsRefused(err) {
		f.t.Fatalf("%s", step)
	}
	f.checkRetried(step, before, res)
	f.count("retry --all", res, err)
	return step
}

// checkRetried: every failed row a retry deleted went back into the outbox
// (its payload is pending there now) and is one the retry reports; every
// outbox row it deleted was a copy marked delivered; every message it
// reports is pending under the reported id, a new one exactly when its
// failure had no UUID.
func (f *fuzz) checkRetried(step string, before fuzzTables, res maintenance.RetryResult) {
	f.t.Helper()
	after := f.read()
	pending := map[string]bool{}
	for _, r := range after.outbox {
		if !r.delivered {
			pending[r.payload] = true
		}
	}
	for id, r := range before.failed {
		if _, ok := after.failed[id]; !ok && !pending[r.payload] {
			f.t.Fatalf("%s: failed row %d (%q) deleted and not put back\nsteps:\n%s", step, id, r.payload, f.history())
		}
	}
	for id, r := range before.outbox {
		if _, ok := after.outbox[id]; !ok && !r.delivered {
			f.t.Fatalf("%s: pending outbox row %d (%q) deleted\nsteps:\n%s", step, id, r.payload, f.history())
		}
	}
	reported := map[uint64]bool{}
	for _, r := range res.Retried {
		got, ok := after.outbox[r.NewID]
		if !ok || got.messageID != r.MessageID || got.delivered {
			f.t.Fatalf("%s: retried %+v, but outbox row %d is %+v\nsteps:\n%s", step, r, r.NewID, got, f.history())
		}
		for _, id := range r.RowIDs {
			was, ok := before.failed[id]
			_, kept := after.failed[id]
			if !ok || kept || was.payload != got.payload || (was.messageID == (outbox.MessageID{})) != r.NewMessageID {
				f.t.Fatalf("%s: retried %+v: failed row %d was %+v (kept %v), put back as %+v\nsteps:\n%s", step, r, id, was, kept, got, f.history())
			}
			reported[id] = true
		}
	}
	for id := range before.failed {
		if _, kept := after.failed[id]; !kept && !reported[id] {
			f.t.Fatalf("%s: failed row %d deleted, and the retry does not report it\nsteps:\n%s", step, id, f.history())
		}
	}
}

// purgeAge purges the failures older than a random whole number of days
// and a half: exactly the rows that failed before then go.
func (f *fuzz) purgeAge(before fuzzTables) string {
	days := 1 + f.rng.IntN(5)
	res, err := maintenance.PurgeFailed(f.ctx, f.db, maintenance.PurgeOptions{OlderThan: time.Duration(days)*24*time.Hour + 12*time.Hour,
		Batch: maintenance.Batch{Size: 1 + f.rng.IntN(4)}})
	step := fmt.Sprintf("purge --older-than %dd12h: %d rows, %v", days, res.Rows, err)
	if err != nil {
		f.t.Fatalf("%s", step)
	}
	after := f.read()
	var want int64
	for id, r := range before.failed {
		_, kept := after.failed[id]
		if old := r.ageDays > days; old == kept {
			f.t.Fatalf("%s: row %d (%q, %d days old) kept %v\nsteps:\n%s", step, id, r.payload, r.ageDays, kept, f.history())
		} else if old {
			want++
		}
	}
	if res.Rows != want || !sameRows(before.outbox, after.outbox) {
		f.t.Fatalf("%s: want %d rows purged and the outbox untouched\nsteps:\n%s", step, want, f.history())
	}
	f.markPurged(after)
	f.tally["purged rows by age"] += int(res.Rows)
	return step
}

// purgeIDs purges one or two random failures, each named by its message
// id or its row id: exactly the rows named go.
func (f *fuzz) purgeIDs(before fuzzTables) string {
	picked := sortedRows(before.failed)
	f.rng.Shuffle(len(picked), func(i, j int) { picked[i], picked[j] = picked[j], picked[i] })
	var o maintenance.PurgeIDsOptions
	named := map[uint64]bool{}
	for _, r := range picked[:min(len(picked), 1+f.rng.IntN(2))] {
		if r.messageID == (outbox.MessageID{}) || f.rng.IntN(2) == 0 {
			o.RowIDs = append(o.RowIDs, r.id)
			named[r.id] = true
			continue
		}
		o.IDs = append(o.IDs, r.messageID)
		for _, s := range before.failed {
			if s.messageID == r.messageID {
				named[s.id] = true
			}
		}
	}
	if len(named) == 0 {
		return "purge by id: nothing picked"
	}
	list, err := maintenance.PurgeFailedIDs(f.ctx, f.db, o)
	step := fmt.Sprintf("purge %v rows %v: %d rows, %v", o.IDs, o.RowIDs, len(list), err)
	if err != nil {
		f.t.Fatalf("%s", step)
	}
	after := f.read()
	for id := range before.failed {
		if _, kept := after.failed[id]; kept == named[id] {
			f.t.Fatalf("%s: row %d named %v, kept %v\nsteps:\n%s", step, id, named[id], kept, f.history())
		}
	}
	if len(list) != len(named) || !sameRows(before.outbox, after.outbox) {
		f.t.Fatalf("%s: want %d rows purged and the outbox untouched\nsteps:\n%s", step, len(named), f.history())
	}
	f.markPurged(after)
	f.tally["purged rows by id"] += len(list)
	return step
}

// markPurged records the messages no longer anywhere: purged for good.
func (f *fuzz) markPurged(now fuzzTables) {
	present := now.payloads()
	for p := range f.msgs {
		if !present[p] && !f.delivered[p] {
			f.purged[p] = true
		}
	}
}

// deliver plays the relay: 1 to 3 pending outbox rows are delivered,
// deleted or marked delivered.
func (f *fuzz) deliver(before fuzzTables) string {
	var pending []fuzzRow
	for _, r := range sortedRows(before.outbox) {
		if !r.delivered {
			pending = append(pending, r)
		}
	}
	f.rng.Shuffle(len(pending), func(i, j int) { pending[i], pending[j] = pending[j], pending[i] })
	pending = pending[:min(len(pending), 1+f.rng.IntN(3))]
	for _, r := range pending {
		if f.rng.IntN(2) == 0 {
			exec(f.t, f.db, "DELETE FROM outbox WHERE id = ?", r.id)
		} else {
			exec(f.t, f.db, "UPDATE outbox SET delivered_at = UTC_TIMESTAMP(6) WHERE id = ?", r.id)
		}
		f.delivered[r.payload] = true
	}
	return fmt.Sprintf("delivered %d outbox rows", len(pending))
}

func (f *fuzz) deliverAll() {
	for _, r := range f.read().outbox {
		f.delivered[r.payload] = true
	}
	exec(f.t, f.db, "DELETE FROM outbox")
}

func (tabs fuzzTables) payloads() map[string]bool {
	present := map[string]bool{}
	for _, m := range []map[uint64]fuzzRow{tabs.failed, tabs.outbox} {
		for _, r := range m {
			present[r.payload] = true
		}
	}
	return present
}

// check: every message not delivered or purged is in outbox_failed or the
// outbox; nothing else is; the outbox holds each message once, under its
// own id or, when it had none, under a new UUIDv7 that no other message
// has.
func (f *fuzz) check(step string) {
	f.t.Helper()
	now := f.read()
	present := now.payloads()
	for p := range f.msgs {
		if !present[p] && !f.delivered[p] && !f.purged[p] {
			f.t.Fatalf("%s: message %q lost\nsteps:\n%s", step, p, f.history())
		}
	}
	inOutbox := map[string]bool{}
	byID := map[outbox.MessageID]string{}
	for _, r := range sortedRows(now.outbox) {
		m := f.msgs[r.payload]
		switch {
		case m == nil:
			f.t.Fatalf("%s: outbox row %d holds %q, never enqueued", step, r.id, r.payload)
		case inOutbox[r.payload]:
			f.t.Fatalf("%s: message %q twice in the outbox\nsteps:\n%s", step, r.payload, f.history())
		case m.id != (outbox.MessageID{}) && r.messageID != m.id:
			f.t.Fatalf("%s: message %q in the outbox as %s, want %s", step, r.payload, r.messageID, m.id)
		case m.id == (outbox.MessageID{}) && (!isV7(r.messageID) || byID[r.messageID] != ""):
			f.t.Fatalf("%s: message %q (id not a UUID) in the outbox as %s, want a new UUIDv7 of its own (%q has it)\nsteps:\n%s",
				step, r.payload, r.messageID, byID[r.messageID], f.history())
		case m.id == (outbox.MessageID{}) && f.newIDs[r.payload] != (outbox.MessageID{}) && f.newIDs[r.payload] != r.messageID:
			f.t.Fatalf("%s: message %q changed its new id from %s to %s", step, r.payload, f.newIDs[r.payload], r.messageID)
		}
		inOutbox[r.payload] = true
		if m.id == (outbox.MessageID{}) {
			byID[r.messageID] = r.payload
			f.newIDs[r.payload] = r.messageID
		}
	}
	for _, r := range now.failed {
		if m := f.msgs[r.payload]; m == nil || m.id != r.messageID || f.purged[r.payload] {
			f.t.Fatalf("%s: outbox_failed row %d holds %q under %s: not a failure of the test's", step, r.id, r.payload, r.messageID)
		}
	}
}

func (f *fuzz) history() string {
	s := ""
	for _, st := range f.steps {
		s += "  " + st + "\n"
	}
	return s
}

func sameTables(a, b fuzzTables) bool {
	return sameRows(a.failed, b.failed) && sameRows(a.outbox, b.outbox)
}

func sameRows(a, b map[uint64]fuzzRow) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
