package relay

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Unit tests of binlog mode's pipeline on fakes (fakes_test.go): the lanes,
// the acker and the handover window, without MariaDB or RabbitMQ.

// unitPipeline is a pipeline whose lanes publish to fake sinks and whose
// acker acknowledges in a fake store, started as runBinlog starts them.
type unitPipeline struct {
	p         *pipeline
	store     *fakeStore
	lease     *fakeLease
	sinks     []*fakeSink
	g         *group
	pubCtx    context.Context
	cancelPub context.CancelFunc
	// readCtx is the run's reading, which the pipeline's stop ends
	// (cancelRead).
	readCtx    context.Context
	cancelRead context.CancelFunc
	pub        *fakeBinlogPub // its connection; its sinks are not the lanes' (sinks are)
	h          *handler
}

func startUnitPipeline(t *testing.T, mod func(*Config)) *unitPipeline {
	t.Helper()
	store := newFakeStore()
	r := unitRelay(t, store, func(c *Config) {
		c.Lanes = 4
		if mod != nil {
			mod(c)
		}
	})
	u := &unitPipeline{store: store, lease: newFakeLease(7), g: &group{}}
	u.readCtx, u.cancelRead = context.WithCancel(context.Background())
	t.Cleanup(u.cancelRead)
	u.pub = &fakeBinlogPub{fakeBroker: newFakeBroker()}
	u.p = r.newPipeline(u.lease, u.pub, u.cancelRead)
	if err := u.p.openLanes(func(onResult func(publish.Result)) (sink, error) {
		s := newFakeSink(onResult)
		u.sinks = append(u.sinks, s)
		return s, nil
	}); err != nil {
		t.Fatal(err)
	}
	u.pubCtx, u.cancelPub = context.WithCancel(context.Background())
	u.p.start(u.g, u.pubCtx)
	t.Cleanup(func() {
		u.g.Signal("lane")
		u.cancelPub()
		u.g.Close()
	})
	u.h = &handler{p: u.p}
	return u
}

// txn is one binlog transaction of the fake source.
type txn struct {
	rows []*outbox.Record
	pos  position.Position
}

// fakeSource is a binlog stream of txns: it hands each to h as the tailer
// does, then returns.
type fakeSource []txn

func (s fakeSource) Run(ctx context.Context, from position.Position, h canal.Handler) error {
	for _, tx := range s {
		for _, r := range tx.rows {
			if err := h.Row(ctx, r); err != nil {
				return err
			}
		}
		if err := h.Commit(ctx, tx.pos, len(tx.rows)); err != nil {
			return err
		}
	}
	return nil
}

var _ source = fakeSource(nil)

func filePos(n uint32) position.Position { return position.Position{File: "bin.000001", Pos: n} }

// read hands txns to the pipeline and waits until n messages were published.
func (u *unitPipeline) read(t *testing.T, n int, txns ...txn) {
	t.Helper()
	before := u.publishedCount()
	if err := fakeSource(txns).Run(context.Background(), position.Position{}, u.h); err != nil {
		t.Fatalf("read: %v", err)
	}
	u.waitPublished(t, before+n)
}

// waitPublished waits until n messages in all were published.
func (u *unitPipeline) waitPublished(t *testing.T, n int) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for u.publishedCount() < n {
		select {
		case <-u.sinks[0].sent:
		case <-u.sinks[1].sent:
		case <-u.sinks[2].sent:
		case <-u.sinks[3].sent:
		case <-deadline.C:
			t.Fatalf("%d messages published, want %d", u.publishedCount(), n)
		}
	}
}

func (u *unitPipeline) publishedCount() int {
	n := 0
	for _, s := range u.sinks {
		n += len(s.ids())
	}
	return n
}

// sinkOf is the sink of the lane of key.
func (u *unitPipeline) sinkOf(key string) *fakeSink { return u.sinks[u.p.lanes.For(key)] }

// The acker acknowledges only rows that have their result, and moves the
// stored position only past transactions whose every row has one; a row
// the broker refused (nack) is acknowledged too, recorded as failed, so its
// partition moves on. Rows of one key are published in order on one lane.
func TestUnitAckOnlyConfirmedInOrder(t *testing.T) {
	u := startUnitPipeline(t, nil)
	u.read(t, 3,
		txn{rows: []*outbox.Record{rec(1, "a"), rec(2, "b")}, pos: filePos(100)},
		txn{rows: []*outbox.Record{rec(3, "a")}, pos: filePos(200)})
	if got := u.sinkOf("a").ids(); !slices.Equal(got, []uint64{1, 3}) && !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("lane of key a published %v, want 1 before 3", got)
	}

	u.sinkOf("b").resolve(t, 2, publish.Confirmed, "")
	u.sinkOf("a").resolve(t, 3, publish.Confirmed, "")
	u.store.until(t, "rows 2 and 3 are acknowledged", func() bool {
		ids, _, _ := u.store.acked()
		return slices.Contains(ids, 2) && slices.Contains(ids, 3)
	})
	ids, _, last := u.store.acked()
	if slices.Contains(ids, 1) {
		t.Fatalf("acknowledged %v: row 1 has no result yet", ids)
	}
	if last.HasPos {
		t.Fatalf("position %v stored while row 1 of its first transaction has no result", last.Pos)
	}

	u.sinkOf("a").resolve(t, 1, publish.Rejected, "nacked 5 times over 1s")
	u.store.until(t, "the position passes both transactions", func() bool {
		_, _, last := u.store.acked()
		return last.HasPos && last.Pos == filePos(200)
	})
	ids, failed, last := u.store.acked()
	slices.Sort(ids)
	if !slices.Equal(ids, []uint64{1, 2, 3}) {
		t.Fatalf("acknowledged %v, want 1, 2, 3 once each", ids)
	}
	if len(failed) != 1 || failed[1] != "nacked 5 times over 1s" {
		t.Fatalf("failed rows %v, want row 1 with the nack's reason", failed)
	}
	if last.Mode != string(ModeBinlog) {
		t.Fatalf("mode stored with the position %q, want binlog", last.Mode)
	}
}

// A failed acknowledgement is retried together with what arrived since:
// nothing is lost or acknowledged twice.
func TestUnitAckRetriedAfterFailure(t *testing.T) {
	u := startUnitPipeline(t, nil)
	u.store.mu.Lock()
	u.store.ackErrs = []error{errors.New("deadlock")}
	u.store.mu.Unlock()
	u.read(t, 2, txn{rows: []*outbox.Record{rec(1, "a"), rec(2, "b")}, pos: filePos(100)})
	u.sinkOf("a").resolve(t, 1, publish.Confirmed, "")
	u.store.until(t, "the first acknowledgement failed", func() bool {
		u.store.mu.Lock()
		defer u.store.mu.Unlock()
		return len(u.store.ackErrs) == 0
	})
	u.sinkOf("b").resolve(t, 2, publish.Confirmed, "")
	u.store.until(t, "the position is stored", func() bool {
		_, _, last := u.store.acked()
		return last.HasPos
	})
	ids, _, _ := u.store.acked()
	slices.Sort(ids)
	if !slices.Equal(ids, []uint64{1, 2}) {
		t.Fatalf("acknowledged %v, want 1 and 2 once each", ids)
	}
}

// On a stop with drain (shutdown, pause, fallback) the pipeline waits for
// in-flight confirms and acknowledges them in a final round; what gets no
// confirm within ShutdownTimeout is not acknowledged (it is published again
// by the next term).
func TestUnitStopDrainsConfirms(t *testing.T) {
	u := startUnitPipeline(t, func(c *Config) { c.ShutdownTimeout = 5 * time.Second })
	u.read(t, 1, txn{rows: []*outbox.Record{rec(1, "a")}, pos: filePos(100)})
	done := make(chan error, 1)
	go func() {
		u.g.Signal("lane")
		done <- u.p.stopPipeline(u.g, u.pubCtx, u.cancelPub, true)
	}()
	u.sinkOf("a").resolve(t, 1, publish.Confirmed, "")
	if err := <-done; err != nil {
		t.Fatalf("stop: %v", err)
	}
	ids, _, last := u.store.acked()
	if !slices.Equal(ids, []uint64{1}) || last.Pos != filePos(100) {
		t.Fatalf("after the stop: acknowledged %v at %v, want row 1 at %v", ids, last.Pos, filePos(100))
	}

	u2 := startUnitPipeline(t, func(c *Config) { c.ShutdownTimeout = 20 * time.Millisecond })
	u2.read(t, 1, txn{rows: []*outbox.Record{rec(1, "a")}, pos: filePos(100)})
	u2.g.Signal("lane")
	if err := u2.p.stopPipeline(u2.g, u2.pubCtx, u2.cancelPub, true); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if ids, _, last := u2.store.acked(); len(ids) > 0 || last.HasPos {
		t.Fatalf("unconfirmed row acknowledged (%v, position %v)", ids, last.Pos)
	}
}

// A lane publishes nothing once the lease may have expired: a standby may
// lead.
func TestUnitLaneStopsWhenLeaseInvalid(t *testing.T) {
	u := startUnitPipeline(t, nil)
	u.lease.mu.Lock()
	u.lease.invalid = true
	u.lease.mu.Unlock()
	if err := u.h.Row(context.Background(), rec(1, "a")); err != nil {
		t.Fatal(err)
	}
	u.g.Signal("lane")
	if err := u.g.Wait("lane"); err == nil || !errors.Is(err, errLeaseExpiredForTest) {
		t.Fatalf("lanes ended with %v, want the expired lease", err)
	}
	if n := u.publishedCount(); n != 0 {
		t.Fatalf("%d messages published after the lease expired", n)
	}
}

// The poll → binlog handover: inside the window (from the sweep's start to
// its end position) only rows still pending are published, and the
// acknowledgements store mode poll; past the window every row is published
// and mode binlog is stored.
func TestUnitHandoverWindow(t *testing.T) {
	u := startUnitPipeline(t, nil)
	u.store.pending[2], u.store.pending[3] = true, true // the sweep delivered 1
	u.p.mode.Store(ModePoll)
	if err := u.h.openWindow(filePos(100), filePos(300), 1<<20); err != nil {
		t.Fatal(err)
	}
	u.read(t, 1, txn{rows: []*outbox.Record{rec(1, "a"), rec(2, "b")}, pos: filePos(200)})
	u.sinkOf("b").resolve(t, 2, publish.Confirmed, "")
	u.store.until(t, "row 2 is acknowledged", func() bool {
		_, _, last := u.store.acked()
		return last.HasPos
	})
	if _, _, last := u.store.acked(); last.Mode != string(ModePoll) {
		t.Fatalf("mode stored inside the window %q, want poll", last.Mode)
	}
	u.read(t, 2,
		txn{rows: []*outbox.Record{rec(3, "c")}, pos: filePos(300)},
		txn{rows: []*outbox.Record{rec(4, "a")}, pos: filePos(400)})
	var all []uint64
	for _, s := range u.sinks {
		all = append(all, s.ids()...)
	}
	slices.Sort(all)
	if !slices.Equal(all, []uint64{2, 3, 4}) {
		t.Fatalf("published %v, want 2 and 3 (pending in the window) and 4 (past it)", all)
	}
	u.sinkOf("c").resolve(t, 3, publish.Confirmed, "")
	u.sinkOf("a").resolve(t, 4, publish.Confirmed, "")
	u.store.until(t, "the position passes the window", func() bool {
		_, _, last := u.store.acked()
		return last.Pos == filePos(400)
	})
	if _, _, last := u.store.acked(); last.Mode != string(ModeBinlog) {
		t.Fatalf("mode stored past the window %q, want binlog", last.Mode)
	}
}

// The state file follows what the lanes send on its own, whatever the
// acknowledgements do: while an acknowledgement hangs (a database that
// stopped answering), a transaction of which a message went out reaches
// the file within a few ackGaps.
func TestUnitStateFileFollowsSentWhileAckStalls(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	u := startUnitPipeline(t, func(c *Config) { c.StateFile = state })
	u.p.r.failover.startTerm(position.FlavorMariaDB)
	stall := make(chan struct{})
	defer close(stall)
	u.store.mu.Lock()
	u.store.ackStall = stall
	u.store.mu.Unlock()
	first, second := rec(1, "a"), rec(2, "b")
	first.GTID, second.GTID = "0-1-11", "0-1-12"

	u.read(t, 1, txn{rows: []*outbox.Record{first}, pos: mariaPos("0-1-11")})
	u.sinkOf("a").resolve(t, 1, publish.Confirmed, "")
	u.store.until(t, "the acknowledgement of 0-1-11 hangs", func() bool {
		u.store.mu.Lock()
		defer u.store.mu.Unlock()
		return u.store.stalled > 0
	})
	u.read(t, 1, txn{rows: []*outbox.Record{second}, pos: mariaPos("0-1-12")})
	file := &stateFile{path: state, relayName: u.p.r.cfg.RelayName}
	var saved position.Position
	// A hundred times the promise (ackGap) for a loaded machine.
	err := progress.WaitPatience(context.Background(), 100*ackGap, "the state file holds 0-1-12", nil, func() bool {
		saved, _ = file.load()
		return saved.GTIDSet == "0-1-12"
	})
	if err != nil {
		t.Fatalf("the state file holds %q while the acknowledgement hangs, want 0-1-12 (sent): %v", saved.GTIDSet, err)
	}
}
