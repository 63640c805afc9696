package canal

import (
	"fmt"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// TestLowerSequenceOfAnotherServerID: with gtid_strict_mode=OFF a domain may
// carry transactions of two server ids whose sequence numbers interleave
// (two primaries writing one domain). A tailer started past a transaction
// with a high sequence number must still deliver the next one even though
// its number is lower, because it comes from another server id; and a
// restart from the position after that one continues with what follows,
// delivering it once.
func TestLowerSequenceOfAnotherServerID(t *testing.T) {
	srv := testenv.StartServer(t, testenv.ServerOptions{ExtraArgs: []string{"--gtid-strict-mode=OFF"}})
	db := srv.CreateDatabase(t)
	setupOutbox(t, db)
	ctx := testCtx(t)
	w := writer(t, db.SQL)
	insert := func(rec *outbox.Record) {
		t.Helper()
		if err := insertRecords(ctx, w, []*outbox.Record{rec}); err != nil {
			t.Fatal(err)
		}
	}
	recs := newRecords(6)
	for _, rec := range recs[:4] { // the server's own sequence climbs past 4
		insert(rec)
	}
	high := currentPosition(t, db.SQL)

	// One transaction as server id 4242 with sequence number 2, below high's.
	other := srv.ServerID() + 4242
	if _, err := w.ExecContext(ctx, fmt.Sprintf("SET SESSION server_id = %d, SESSION gtid_seq_no = 2", other)); err != nil {
		t.Fatal(err)
	}
	insert(recs[4])
	if _, err := w.ExecContext(ctx, fmt.Sprintf("SET SESSION server_id = %d", srv.ServerID())); err != nil {
		t.Fatal(err)
	}
	lower := currentPosition(t, db.SQL)
	if want := fmt.Sprintf("0-%d-2", other); lower.GTIDSet != want {
		t.Fatalf("position after the other server id's transaction = %s, want %s", lower.GTIDSet, want)
	}
	insert(recs[5])
	end := currentPosition(t, db.SQL)
	fillIDs(t, db.SQL, recs)

	tl, err := New(tailerConfig(t, db))
	if err != nil {
		t.Fatal(err)
	}
	run := func(from position.Position, want ...*outbox.Record) []collected {
		t.Helper()
		c := &collector{}
		r := startRun(t, tl, from, c)
		waitFor(t, r, func() bool { p, ok := c.lastPos(); return ok && p.GTIDSet == end.GTIDSet })
		if err := r.stop(); err != nil {
			t.Fatalf("Run from %s: %v", from, err)
		}
		got, txns := c.snapshot()
		if len(got) != len(want) {
			t.Fatalf("Run from %s: got %d rows, want %d (ids %v)", from, len(got), len(want), ids(got))
		}
		for i := range want {
			if !sameRecord(got[i], want[i]) {
				t.Fatalf("Run from %s: row %d is id %d, want id %d", from, i, got[i].ID, want[i].ID)
			}
		}
		return txns
	}
	txns := run(high, recs[4], recs[5])
	if txns[0].pos.GTIDSet != lower.GTIDSet {
		t.Errorf("Commit position after the lower-numbered transaction = %s, want %s", txns[0].pos.GTIDSet, lower.GTIDSet)
	}
	// Restarted from that position (as from a checkpoint): the rest, once.
	run(txns[0].pos, recs[5])
}

func ids(recs []*outbox.Record) []uint64 {
	out := make([]uint64, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}
