package canal

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/position"
)

// durableServer is a private server that fsyncs the binlog and the redo log at
// every commit: the binlog fsync lies between a transaction entering the
// binlog (and @@gtid_binlog_pos) and its commit becoming visible, so it
// widens the gap SnapshotPosition closes to the time of a disk flush.
func durableServer(t *testing.T) *testenv.DB {
	t.Helper()
	srv := testenv.StartServer(t, testenv.ServerOptions{ExtraArgs: []string{
		"--sync-binlog=1", "--innodb-flush-log-at-trx-commit=1"}})
	db := srv.CreateDatabase(t)
	setupOutbox(t, db)
	return db
}

// visibility is what one read saw right after a position was taken: every id
// up to max except those in missing.
type visibility struct {
	pos     position.Position
	max     uint64
	missing map[uint64]bool
}

func (v visibility) sees(id uint64) bool { return id <= v.max && !v.missing[id] }

// TestSnapshotPositionHoldsOnlyVisibleTransactions: under eight producers
// committing small transactions on a server that fsyncs at every commit,
// each position SnapshotPosition returns holds only transactions whose rows a
// read started right after it can see. (The poll → binlog handover relies on
// it: a transaction in the start position that the sweep cannot see yet is
// delivered by neither.) The binlog, read afterwards, says which transactions
// each position holds.
func TestSnapshotPositionHoldsOnlyVisibleTransactions(t *testing.T) {
	db := durableServer(t)
	ctx := testCtx(t)
	start := currentPosition(t, db.SQL)

	prodCtx, stopProducers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for p := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; prodCtx.Err() == nil; n++ {
				err := insertRecords(prodCtx, db.SQL, newRecords(1+(p+n)%3))
				if err != nil && prodCtx.Err() == nil {
					errs <- err
					return
				}
			}
		}()
	}

	// Positions and what a read right after each saw, for a few seconds of
	// load. Rows are never deleted here, so a read sees every id up to its
	// largest but those of transactions not yet visible.
	var seen []visibility
	var floor uint64 // every id up to floor was visible to an earlier read
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		pos, err := SnapshotPosition(ctx, db.SQL)
		if err != nil {
			t.Fatal(err)
		}
		v, err := readVisible(ctx, db.SQL, floor)
		if err != nil {
			t.Fatal(err)
		}
		v.pos = pos
		seen = append(seen, v)
		floor = v.max
		for id := range v.missing {
			floor = min(floor, id-1)
		}
	}
	stopProducers()
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("producer: %v", err)
	default:
	}

	end := currentPosition(t, db.SQL)
	tl, err := New(tailerConfig(t, db))
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	r := startRun(t, tl, start, c)
	waitCovered(t, r, c, end, 60*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	recs, txns := c.snapshot()

	// Positions and transactions both come in binlog order, and what a read
	// saw stays visible, so each position is checked against the
	// transactions it holds that the one before did not.
	bad, checked, next, i := 0, 0, 0, 0
	for _, v := range seen {
		for ; i < len(txns); i++ {
			tx := txns[i]
			in, err := position.Reached(v.pos, tx.pos)
			if err != nil {
				t.Fatal(err)
			}
			if !in {
				break
			}
			for _, rec := range recs[next : next+tx.rows] {
				checked++
				if !v.sees(rec.ID) {
					bad++
					if bad <= 5 {
						t.Errorf("position %s holds the transaction of row %d (committed at %s), but a read right after it did not see that row",
							v.pos.GTIDSet, rec.ID, tx.pos.GTIDSet)
					}
				}
			}
			next += tx.rows
		}
	}
	t.Logf("%d positions taken under load, %d rows in %d transactions; %d row checks, %d rows invisible though in the position",
		len(seen), len(recs), len(txns), checked, bad)
	if len(seen) < 20 {
		t.Fatalf("only %d positions taken: the check proves little", len(seen))
	}
}

// readVisible reads the ids above floor that a fresh read sees.
func readVisible(ctx context.Context, db *sql.DB, floor uint64) (visibility, error) {
	v := visibility{max: floor, missing: map[uint64]bool{}}
	rows, err := db.QueryContext(ctx, "SELECT id FROM outbox WHERE id > ? ORDER BY id", floor)
	if err != nil {
		return v, err
	}
	defer rows.Close()
	for rows.Next() {
		var id uint64
		if err := rows.Scan(&id); err != nil {
			return v, err
		}
		for gap := v.max + 1; gap < id; gap++ {
			v.missing[gap] = true
		}
		v.max = id
	}
	if err := rows.Err(); err != nil {
		return v, err
	}
	if len(v.missing) > 10_000 {
		return v, errors.New("too many invisible ids: the producers leave gaps in AUTO_INCREMENT?")
	}
	return v, nil
}
