package canal

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// TestStreamExactlyOnce writes outbox transactions of one and 500 rows with
// foreign-table, UPDATE/DELETE and DDL transactions between them, and checks
// that every row arrives once, in commit order, field for field, that Commit
// positions strictly advance, and that a Run restarted from any Commit
// position delivers exactly what followed it.
func TestStreamExactlyOnce(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	ctx := testCtx(t)
	w := writer(t, db.SQL)
	start := currentPosition(t, db.SQL)

	recs := newRecords(504)
	one, big, two, last := recs[0:1], recs[1:501], recs[501:503], recs[503:504]
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := w.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	insertTx := func(rs []*outbox.Record, foreign bool) {
		t.Helper()
		tx, err := w.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := insertRecords(ctx, tx, rs); err != nil {
			t.Fatal(err)
		}
		if foreign {
			if _, err := tx.ExecContext(ctx, "INSERT INTO other (v) VALUES ('in the same transaction')"); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}

	insertTx(one, false)                                                                                  // 1 row
	exec("INSERT INTO other (v) VALUES ('foreign')")                                                      // foreign
	insertTx(big, false)                                                                                  // 500 rows
	fillIDs(t, db.SQL, recs[:501])                                                                        // before the DELETE removes one
	exec("UPDATE outbox SET attempts = attempts + 1")                                                     // UPDATE rows: ignored
	exec("DELETE FROM outbox WHERE id = ?", big[0].ID)                                                    // DELETE rows: ignored
	insertTx(two, true)                                                                                   // 2 rows + a foreign row
	exec("ALTER TABLE other ADD COLUMN c INT")                                                            // DDL
	exec("INSERT INTO outbox (message_id, routing_key, payload) VALUES (UNHEX('0102'), 'defaults', 'x')") // server defaults
	insertTx(last, false)
	fillIDs(t, db.SQL, recs)
	end := currentPosition(t, db.SQL)

	tl, err := New(tailerConfig(t, db))
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	r := startRun(t, tl, start, c)
	waitCovered(t, r, c, end, 30*time.Second)
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	got, txns := c.snapshot()
	if c.err != nil {
		t.Fatal(c.err)
	}

	// Rows: exactly the inserted ones, in order, field for field.
	if len(got) != len(recs)+1 {
		t.Fatalf("got %d rows, want %d", len(got), len(recs)+1)
	}
	want := append(append(append([]*outbox.Record{}, recs[:503]...), nil), last...)
	for i, g := range got {
		if i == 503 { // the row written with server defaults
			if g.MessageID != (outbox.MessageID{1, 2}) || g.RoutingKey != "defaults" || g.ContentType != "application/json" ||
				g.Headers != nil || !g.AvailableAt.IsZero() || time.Since(g.CreatedAt).Abs() > time.Minute {
				t.Errorf("defaults row: %+v (created_at must be UTC: time_zone is +00:00)", g)
			}
			continue
		}
		if !sameRecord(g, want[i]) {
			t.Fatalf("row %d:\n got %+v\nwant %+v", i, g, want[i])
		}
	}

	// Transactions: one Commit each, rows counted, positions strictly advancing.
	var counts []int
	for i, tx := range txns {
		if tx.rows > 0 {
			counts = append(counts, tx.rows)
		}
		if i > 0 && (!covers(t, tx.pos, txns[i-1].pos) || covers(t, txns[i-1].pos, tx.pos)) {
			t.Errorf("position %s does not advance past %s", tx.pos, txns[i-1].pos)
		}
	}
	if wantCounts := []int{1, 500, 2, 1, 1}; !equalInts(counts, wantCounts) {
		t.Errorf("rows per transaction %v, want %v", counts, wantCounts)
	}
	if len(txns) < 9 {
		t.Errorf("%d commits, want at least 9 (every transaction, foreign and DDL included)", len(txns))
	}

	// A restart from each Commit position delivers exactly what followed it.
	for i, tx := range txns {
		var after []uint64
		for _, rec := range got[sumRows(txns[:i+1]):] {
			after = append(after, rec.ID)
		}
		c2 := &collector{}
		r2 := startRun(t, tl, tx.pos, c2)
		extra := 0
		if covers(t, tx.pos, end) {
			// Nothing follows this position: a foreign transaction written
			// now is the first and only thing to arrive.
			exec("INSERT INTO other (v) VALUES ('after the end')")
			waitCovered(t, r2, c2, currentPosition(t, db.SQL), 30*time.Second)
			extra = 1
		} else {
			waitCovered(t, r2, c2, end, 30*time.Second)
		}
		if err := r2.stop(); err != nil {
			t.Fatalf("Run from %s: %v", tx.pos, err)
		}
		got2, txns2 := c2.snapshot()
		var ids []uint64
		for _, rec := range got2 {
			ids = append(ids, rec.ID)
		}
		if !equalU64(ids, after) {
			t.Fatalf("Run from commit %d (%s): got ids %v, want %v", i, tx.pos, short(ids), short(after))
		}
		if len(txns2) != len(txns)-i-1+extra {
			t.Errorf("Run from commit %d: %d commits, want %d", i, len(txns2), len(txns)-i-1+extra)
		}
	}
}

func sumRows(txns []collected) int {
	n := 0
	for _, tx := range txns {
		n += tx.rows
	}
	return n
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// short abbreviates a long id list for failure messages.
func short(ids []uint64) []uint64 {
	if len(ids) > 12 {
		return append(append([]uint64{}, ids[:6]...), ids[len(ids)-6:]...)
	}
	return ids
}

// TestStreamFilePosition streams by file and offset (servers without GTIDs),
// with the flavor detected from the server: Commit positions are file
// positions and a restart from one continues after it.
func TestStreamFilePosition(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	ctx := testCtx(t)
	var file string
	var pos uint32
	if err := db.SQL.QueryRowContext(ctx, "SHOW MASTER STATUS").Scan(&file, &pos, new(any), new(any)); err != nil {
		t.Fatal(err)
	}
	tl, err := New(tailerConfig(t, db))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := insertRecords(ctx, db.SQL, newRecords(10)); err != nil {
			t.Fatal(err)
		}
	}
	want := tableIDs(t, db.SQL)

	c := &collector{}
	r := startRun(t, tl, position.Position{File: file, Pos: pos}, c)
	waitFor(t, r, func() bool { got, _ := c.snapshot(); return len(got) >= len(want) })
	// Foreign transactions may follow; give them no chance to matter.
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, c, want)
	_, txns := c.snapshot()
	first := txns[0].pos
	if first.GTIDSet != "" || first.File == "" || first.Pos <= pos || first.Flavor != FlavorMariaDB {
		t.Fatalf("first commit position %+v, want a mariadb file position after %s:%d", first, file, pos)
	}

	c2 := &collector{}
	r2 := startRun(t, tl, first, c2)
	waitFor(t, r2, func() bool { got, _ := c2.snapshot(); return len(got) >= len(want)-10 })
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, c2, want[10:])
}

// waitFor polls cond until it holds, failing when Run returns first.
func waitFor(t testing.TB, r *running, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if err, ok := r.exited(); ok {
			t.Fatalf("Run returned early: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
