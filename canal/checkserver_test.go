package canal

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// Every row carries its transaction's GTID. CheckServer runs before each
// reconnected dump, not before the first: an error it returns is retried
// like a failed connection, and a *StopError ends Run with that error
// before anything more is read. CheckDumpServer gets the server_id of the
// server every dump is on, the first dump's included.
func TestCheckServerOnReconnect(t *testing.T) {
	db := testenv.MySQL(t)
	setupOutbox(t, db)
	ctx := testCtx(t)
	p, cfg := proxiedTailerConfig(t, db)
	refuse := errors.New("this server lacks what was published")
	var checks atomic.Int32
	cfg.CheckServer = func(context.Context) error {
		switch checks.Add(1) {
		case 1:
			return errors.New("a check that could not reach the server") // retried
		case 2:
			return nil
		default:
			return &StopError{Err: refuse}
		}
	}
	var serverID uint32
	if err := db.SQL.QueryRowContext(ctx, "SELECT @@server_id").Scan(&serverID); err != nil {
		t.Fatal(err)
	}
	var dumps atomic.Int32
	var wrongID atomic.Uint32
	cfg.CheckDumpServer = func(id uint32) error {
		dumps.Add(1)
		if id != serverID {
			wrongID.Store(id)
		}
		return nil
	}
	tl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	r := startRun(t, tl, currentPosition(t, db.SQL), c)
	if err := insertRecords(ctx, db.SQL, newRecords(2)); err != nil {
		t.Fatal(err)
	}
	var gtid string
	if err := db.SQL.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&gtid); err != nil {
		t.Fatal(err)
	}
	waitCovered(t, r, c, currentPosition(t, db.SQL), 30*time.Second)
	if n := checks.Load(); n != 0 {
		t.Fatalf("CheckServer ran %d times before any reconnect, want 0", n)
	}
	if n, w := dumps.Load(), wrongID.Load(); n != 1 || w != 0 {
		t.Fatalf("CheckDumpServer ran %d times for the first dump (want 1); a dump's server_id %d, the server's %d", n, w, serverID)
	}
	recs, _ := c.snapshot()
	if len(recs) != 2 || recs[0].GTID == "" || recs[0].GTID != recs[1].GTID || !strings.HasSuffix(gtid, recs[0].GTID) {
		t.Fatalf("rows of one transaction carry GTIDs %q, %q; want the transaction's, %s", recs[0].GTID, recs[1].GTID, gtid)
	}

	p.Cut() // the first check fails, the second passes: the stream resumes
	if err := insertRecords(ctx, db.SQL, newRecords(1)); err != nil {
		t.Fatal(err)
	}
	waitCovered(t, r, c, currentPosition(t, db.SQL), 30*time.Second)
	if n := checks.Load(); n != 2 {
		t.Fatalf("CheckServer ran %d times over one cut, want 2 (one failed, retried)", n)
	}
	if n, w := dumps.Load(), wrongID.Load(); n != 2 || w != 0 {
		t.Fatalf("CheckDumpServer ran %d times over two dumps; a dump's server_id %d, the server's %d", n, w, serverID)
	}

	p.Cut() // the third refuses
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run went on after CheckServer returned a *StopError")
	}
	if !errors.Is(r.err, refuse) {
		t.Fatalf("Run returned %v, want the check's error", r.err)
	}
}
