package relay

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Unit tests of binlog mode's reading on fakes: the source (through the
// binlogServer seam) → the lanes → the sinks → the acker → the progress
// store, and the stop at a transaction boundary.

// fakeBinlog is a server whose binlog is src: every position is still
// there. Preflight answers with preflight (nil: the binlog is readable),
// SnapshotPosition with snapshot (nil: an error).
type fakeBinlog struct {
	src       source
	preflight func() error
	snapshot  func() (position.Position, error) // nil: none
}

func (b fakeBinlog) Preflight(ctx context.Context) error {
	if b.preflight == nil {
		return nil
	}
	return b.preflight()
}
func (b fakeBinlog) CheckPosition(ctx context.Context, from position.Position) error { return nil }
func (b fakeBinlog) SnapshotPosition(ctx context.Context) (position.Position, error) {
	if b.snapshot == nil {
		return position.Position{}, errors.New("no snapshot in this unit test")
	}
	return b.snapshot()
}
func (b fakeBinlog) Open(onRetry func(err error, attempt int)) (source, error) { return b.src, nil }

// scriptSource is a binlog stream of txns, delivered as the tailer does:
// it returns ctx's error once ctx has ended (checked before every row and
// commit), and after the last transaction it waits for ctx like a live
// stream. With pauseAt > 0 it stops before its pauseAt'th event (rows and
// commits counted from 1), closes reached, and goes on once release is
// closed (or returns when ctx ends).
type scriptSource struct {
	txns             []txn
	pauseAt          int
	reached, release chan struct{}
	from             position.Position // what Run was called with
	ran              bool
	end              error // returned after the last transaction instead of waiting for ctx
}

func (s *scriptSource) Run(ctx context.Context, from position.Position, h canal.Handler) error {
	s.from, s.ran = from, true
	event := 0
	next := func() error {
		event++
		if event == s.pauseAt {
			close(s.reached)
			select {
			case <-s.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return ctx.Err()
	}
	for _, tx := range s.txns {
		for _, r := range tx.rows {
			if err := next(); err != nil {
				return err
			}
			if err := h.Row(ctx, r); err != nil {
				return err
			}
		}
		if err := next(); err != nil {
			return err
		}
		if err := h.Commit(ctx, tx.pos, len(tx.rows)); err != nil {
			return err
		}
	}
	if s.end != nil {
		return s.end
	}
	<-ctx.Done()
	return ctx.Err()
}

// unitRead is binlog mode's reading of u's pipeline from the stored
// position at, on src: it runs read and the stop at a boundary
// (stopReading) as runBinlog does; stopTerm is the shutdown, and readDone
// receives read's result.
type unitRead struct {
	stopTerm func()
	readDone chan error
}

func (u *unitPipeline) startRead(t *testing.T, src *scriptSource, at position.Position) *unitRead {
	t.Helper()
	if b, ok := u.p.r.binlog.(fakeBinlog); ok {
		b.src = src
		u.p.r.binlog = b
	} else {
		u.p.r.binlog = fakeBinlog{src: src}
	}
	termCtx, stopTerm := context.WithCancel(context.Background())
	t.Cleanup(stopTerm)
	u.g.Go("stop-reading", u.cancelRead, func() error { u.p.stopReading(termCtx, u.readCtx); return nil })
	rd := &unitRead{stopTerm: stopTerm, readDone: make(chan error, 1)}
	go func() { rd.readDone <- u.p.read(u.readCtx, checkpoint.Progress{Position: at, Mode: ""}, false) }()
	return rd
}

// stop ends the run as runBinlog does on a shutdown: it waits for reading
// to end, then drains the confirms and lets the acker acknowledge them.
func (u *unitPipeline) stop(t *testing.T, rd *unitRead) {
	t.Helper()
	rd.stopTerm()
	if err := <-rd.readDone; err != nil {
		t.Fatalf("read ended with %v, want nil on a shutdown", err)
	}
	u.g.Signal("lane")
	if err := u.p.stopPipeline(u.g, u.pubCtx, u.cancelPub, true); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// keyOrder fails unless the rows of want (one partition key's, in commit
// order) were published in that order.
func (u *unitPipeline) keyOrder(t *testing.T, key string, want ...uint64) {
	t.Helper()
	got := slices.DeleteFunc(u.sinkOf(key).ids(), func(id uint64) bool { return !slices.Contains(want, id) })
	if !slices.Equal(got, want) {
		t.Fatalf("rows of key %s published as %v, want %v", key, got, want)
	}
}

// positions returns every position stored so far, in order.
func (s *fakeStore) positions() []position.Position {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []position.Position
	for _, a := range s.acks {
		if a.HasPos {
			out = append(out, a.Pos)
		}
	}
	return out
}

// Binlog mode end to end on fakes: read resumes the source at the stored
// position; every row is published in order per key and acknowledged once;
// the stored position moves only over whole transactions whose every row
// has its result, whatever order the confirms come in; a shutdown between
// transactions ends reading at once and acknowledges the rest.
func TestUnitBinlogEndToEnd(t *testing.T) {
	u := startUnitPipeline(t, nil)
	src := &scriptSource{txns: []txn{
		{rows: []*outbox.Record{rec(1, "a"), rec(2, "b")}, pos: filePos(100)},
		{rows: []*outbox.Record{rec(3, "a"), rec(4, "c")}, pos: filePos(200)},
		{rows: []*outbox.Record{rec(5, "b")}, pos: filePos(300)},
	}}
	rd := u.startRead(t, src, filePos(50))
	u.waitPublished(t, 5)
	if src.from != filePos(50) {
		t.Fatalf("source started at %v, want the stored position %v", src.from, filePos(50))
	}
	if !u.p.r.Tailing() {
		t.Fatal("not tailing while reading the binlog")
	}
	u.keyOrder(t, "a", 1, 3)
	u.keyOrder(t, "b", 2, 5)

	confirm := func(ids ...uint64) {
		for _, id := range ids {
			u.sinkOf(map[uint64]string{1: "a", 2: "b", 3: "a", 4: "c", 5: "b"}[id]).resolve(t, id, publish.Confirmed, "")
		}
	}
	ackedAll := func(want ...uint64) func() bool {
		return func() bool {
			ids, _, _ := u.store.acked()
			for _, id := range want {
				if !slices.Contains(ids, id) {
					return false
				}
			}
			return true
		}
	}
	confirm(3, 4) // the second transaction, not the first
	u.store.until(t, "rows 3 and 4 are acknowledged", ackedAll(3, 4))
	if pos := u.store.positions(); len(pos) > 0 {
		t.Fatalf("positions %v stored while the first transaction has no result", pos)
	}
	confirm(1)
	u.store.until(t, "row 1 is acknowledged", ackedAll(1))
	if pos := u.store.positions(); len(pos) > 0 {
		t.Fatalf("positions %v stored while row 2 of the first transaction has no result", pos)
	}
	confirm(2)
	u.store.until(t, "the position passes the first two transactions", func() bool {
		pos := u.store.positions()
		return len(pos) > 0 && pos[len(pos)-1] == filePos(200)
	})
	confirm(5)
	u.stop(t, rd)
	if u.p.r.Tailing() {
		t.Fatal("still tailing after the shutdown")
	}

	ids, failed, last := u.store.acked()
	slices.Sort(ids)
	if !slices.Equal(ids, []uint64{1, 2, 3, 4, 5}) || len(failed) > 0 {
		t.Fatalf("acknowledged %v (failed %v), want 1 to 5 once each", ids, failed)
	}
	if last.Pos != filePos(300) || last.Mode != string(ModeBinlog) {
		t.Fatalf("stored %v in mode %q, want %v in binlog", last.Pos, last.Mode, filePos(300))
	}
	commits := []position.Position{filePos(100), filePos(200), filePos(300)}
	for i, pos := range u.store.positions() {
		if !slices.Contains(commits, pos) || i > 0 && pos.Pos < u.store.positions()[i-1].Pos {
			t.Fatalf("positions stored %v: each must be a transaction's end, never going back", u.store.positions())
		}
	}
}

// midTxnSource is three transactions; it pauses after the first row of the
// second (3 events in: row 1, commit, row 2).
func midTxnSource() *scriptSource {
	return &scriptSource{txns: []txn{
		{rows: []*outbox.Record{rec(1, "a")}, pos: filePos(100)},
		{rows: []*outbox.Record{rec(2, "a"), rec(3, "b"), rec(4, "c")}, pos: filePos(200)},
		{rows: []*outbox.Record{rec(5, "a")}, pos: filePos(300)},
	}, pauseAt: 4, reached: make(chan struct{}), release: make(chan struct{})}
}

// A shutdown in the middle of a transaction whose rows were handed to the
// lanes reads that transaction to its end first, and nothing after it: the
// stop acknowledges it whole, and a restart publishes none of it again.
func TestUnitShutdownReadsTxnToItsEnd(t *testing.T) {
	u := startUnitPipeline(t, nil)
	src := midTxnSource()
	rd := u.startRead(t, src, filePos(50))
	<-src.reached
	rd.stopTerm()
	<-u.p.stop // the stop has begun
	close(src.release)
	if err := <-rd.readDone; err != nil {
		t.Fatalf("read: %v", err)
	}
	u.waitPublished(t, 4)
	for id, key := range map[uint64]string{1: "a", 2: "a", 3: "b", 4: "c"} {
		u.sinkOf(key).resolve(t, id, publish.Confirmed, "")
	}
	u.g.Signal("lane")
	if err := u.p.stopPipeline(u.g, u.pubCtx, u.cancelPub, true); err != nil {
		t.Fatalf("stop: %v", err)
	}
	// The lanes have published their queues whole: all that was read.
	if all := u.publishedIDs(); !slices.Equal(all, []uint64{1, 2, 3, 4}) {
		t.Fatalf("published %v, want the first two transactions whole (1 to 4) and nothing of the third", all)
	}
	if _, _, last := u.store.acked(); last.Pos != filePos(200) {
		t.Fatalf("stored %v after the stop, want the end of the transaction under way %v", last.Pos, filePos(200))
	}
}

// publishedIDs is every outbox id published, sorted.
func (u *unitPipeline) publishedIDs() []uint64 {
	var all []uint64
	for _, s := range u.sinks {
		all = append(all, s.ids()...)
	}
	slices.Sort(all)
	return all
}
