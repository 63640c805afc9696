package relay

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/poller"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Unit tests on fakes of binlog mode's first start: the sweep of the rows
// already pending, between two snapshot positions Gs and Ge, then the tail
// from Gs through the handover window; and a stop during the sweep.

type fakeDrainer func(ctx context.Context, stop <-chan struct{}) (int, error)

func (d fakeDrainer) DrainUntil(ctx context.Context, stop <-chan struct{}) (int, error) {
	return d(ctx, stop)
}

// firstStart wires u's relay for a first start: the server's snapshots are
// gs then ge, and drain is the sweep. steps records the order of the
// snapshots and the sweep.
func (u *unitPipeline) firstStart(gs, ge position.Position, drain fakeDrainer) (steps func() []string) {
	var mu sync.Mutex
	var seen []string
	snaps := []position.Position{gs, ge}
	u.p.r.binlog = fakeBinlog{snapshot: func() (position.Position, error) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, "snapshot")
		pos := snaps[0]
		snaps = snaps[1:]
		return pos, nil
	}}
	u.pub.drainer = fakeDrainer(func(ctx context.Context, stop <-chan struct{}) (int, error) {
		mu.Lock()
		seen = append(seen, "sweep")
		mu.Unlock()
		return drain(ctx, stop)
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// A first start (no stored position) takes Gs, sweeps what is pending,
// takes Ge, and tails from Gs: up to Ge it publishes only rows still
// pending (the sweep delivered the others), past Ge every row; the stored
// position ends past the window in mode binlog.
func TestUnitFirstStartSweepThenWindow(t *testing.T) {
	u := startUnitPipeline(t, nil)
	u.store.pending[2] = true // the sweep delivered row 1; row 2 committed after it looked
	steps := u.firstStart(filePos(100), filePos(200), func(ctx context.Context, stop <-chan struct{}) (int, error) {
		return 1, nil
	})
	src := &scriptSource{txns: []txn{
		{rows: []*outbox.Record{rec(1, "a"), rec(2, "b")}, pos: filePos(200)},
		{rows: []*outbox.Record{rec(3, "c")}, pos: filePos(300)},
	}}
	rd := u.startRead(t, src, position.Position{})
	u.waitPublished(t, 2)
	if got := steps(); !slices.Equal(got, []string{"snapshot", "sweep", "snapshot"}) {
		t.Fatalf("first start did %v, want the snapshot Gs, the sweep, the snapshot Ge", got)
	}
	if src.from != filePos(100) {
		t.Fatalf("tail started at %v, want Gs %v", src.from, filePos(100))
	}
	u.sinkOf("b").resolve(t, 2, publish.Confirmed, "")
	u.sinkOf("c").resolve(t, 3, publish.Confirmed, "")
	u.stop(t, rd)
	if got := u.publishedIDs(); !slices.Equal(got, []uint64{2, 3}) {
		t.Fatalf("published %v, want 2 (pending inside the window) and 3 (past it), not 1 (swept)", got)
	}
	if _, _, last := u.store.acked(); last.Pos != filePos(300) || last.Mode != string(ModeBinlog) {
		t.Fatalf("stored %v in mode %q, want %v in binlog", last.Pos, last.Mode, filePos(300))
	}
}

// A stop during the first start's sweep lets its rounds under way commit
// and tails nothing; it waits for them at most Config.ShutdownTimeout, and
// not at all while the broker is unreachable: then it cuts them (they roll
// back) and logs at WARN how many messages will be published again.
func TestUnitFirstStartSweepStops(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		down    bool
		commits bool // the rounds under way commit once stop closes
		want    string
	}{
		{name: "the rounds commit", timeout: time.Hour, commits: true},
		{name: "the rounds outlast ShutdownTimeout", timeout: 20 * time.Millisecond, want: "did not finish within"},
		{name: "the broker is down", timeout: time.Hour, down: true, want: "did not finish within"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := startUnitPipeline(t, func(c *Config) { c.ShutdownTimeout = tc.timeout })
			logs := observeLogs(u.p.r)
			sweeping := make(chan struct{})
			u.firstStart(filePos(100), filePos(200), func(ctx context.Context, stop <-chan struct{}) (int, error) {
				close(sweeping)
				<-stop
				if tc.commits && ctx.Err() == nil { // not cut: they commit
					return 3, poller.ErrStopped
				}
				<-ctx.Done() // the cut rolls the rounds back
				return 0, &poller.CutError{Rounds: 1, Messages: 4, Err: ctx.Err()}
			})
			src := &scriptSource{txns: []txn{{rows: []*outbox.Record{rec(9, "a")}, pos: filePos(300)}}}
			rd := u.startRead(t, src, position.Position{})
			<-sweeping
			if tc.down {
				u.pub.setDown(true)
			}
			rd.stopTerm()
			if err := within(t, "reading stops", rd.readDone); err != nil {
				t.Fatalf("read: %v", err)
			}
			if src.ran || u.p.r.Tailing() {
				t.Fatal("tailed the binlog after a stop during the sweep")
			}
			warned(t, logs, tc.want, 4)
		})
	}
}

// The due-time sweep of delayed rows does not start before the first
// start's sweep has ended: it waits for the stream's start to be marked
// (positioned), and that comes after the sweep. Both claim due delayed rows
// FOR UPDATE SKIP LOCKED, so side by side the due-time sweep would take a
// key's later row while a sweep round still published its earlier one, and
// the key's delayed rows would reach the queue out of order (seen in
// TestRunStreamNeverLosesToDeduplication on a loaded machine). The sweep
// itself delivers the rows due while it runs, in order, as poll rounds do.
func TestUnitDueTimeSweepWaitsForTheFirstStartSweep(t *testing.T) {
	u := startUnitPipeline(t, nil)
	markedDuringSweep := make(chan bool, 1)
	u.firstStart(filePos(100), filePos(200), func(ctx context.Context, stop <-chan struct{}) (int, error) {
		select {
		case <-u.p.positioned:
			markedDuringSweep <- true
		default:
			markedDuringSweep <- false
		}
		return 0, nil
	})
	rd := u.startRead(t, &scriptSource{}, position.Position{})
	if within(t, "the sweep", markedDuringSweep) {
		t.Fatal("the stream's start was marked before the sweep ended: the due-time sweep would claim delayed rows beside the sweep's rounds")
	}
	within(t, "the stream's start marked after the sweep", u.p.positioned)
	u.stop(t, rd)
}
