package relay

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// Unit tests on fakes of binlog mode's due-time sweep (runSweeper): it
// sleeps until the earliest delayed row is due on the server's clock,
// whatever the skew, wakes sooner for a row the stream reads that is due
// sooner, and sends nothing while nothing is due. Timings in milliseconds.

// sweepInterval is --poll-interval in these tests; slack is how late a
// loaded machine's timer may be: generous, since a busy machine must not
// fail the tests, and still far below the skews (an hour) a sweep that
// misread the server's clock would be off by. What the tests count
// (rounds, looks) is what tells a sleeping sweep from a polling one.
const sweepInterval, slack = 20 * time.Millisecond, 5 * time.Second

// fakeDelayed is a table of delayed rows on a server whose clock is skew
// ahead of the relay's. Round delivers up to batch rows due on that clock.
type fakeDelayed struct {
	skew  time.Duration
	batch int

	mu        sync.Mutex
	pending   []time.Time // available_at of the pending rows, server clock
	looks     int
	rounds    []time.Time   // server clock
	empty     int           // rounds that found nothing due
	delivered chan late     // one per row delivered
	looked    chan struct{} // one per look
}

// late is a delivered row: how long after its due time it went out (server
// clock; negative: early).
type late struct {
	due   time.Time
	after time.Duration
}

func newFakeDelayed(skew time.Duration, batch int, pending ...time.Time) *fakeDelayed {
	return &fakeDelayed{skew: skew, batch: batch, pending: pending, delivered: make(chan late, 100), looked: make(chan struct{}, 100)}
}

func (f *fakeDelayed) serverNow() time.Time { return time.Now().Add(f.skew).UTC() }

// in returns the server's time d from now.
func (f *fakeDelayed) in(d time.Duration) time.Time { return f.serverNow().Add(d) }

func (f *fakeDelayed) Earliest(context.Context) (time.Time, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.looks++
	f.looked <- struct{}{}
	var first time.Time
	for _, at := range f.pending {
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first, f.serverNow(), nil
}

func (f *fakeDelayed) Round(context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.serverNow()
	f.rounds = append(f.rounds, now)
	slices.SortFunc(f.pending, func(a, b time.Time) int { return a.Compare(b) })
	n := 0
	for n < len(f.pending) && n < f.batch && !f.pending[n].After(now) {
		f.delivered <- late{due: f.pending[n], after: now.Sub(f.pending[n])}
		n++
	}
	f.pending = f.pending[n:]
	if n == 0 {
		f.empty++
	}
	return n, nil
}

func (f *fakeDelayed) Close() error { return nil }

// insert adds a row to the table (committed: the stream reads it next).
func (f *fakeDelayed) insert(at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = append(f.pending, at)
}

// counts returns the looks and rounds so far, and the rounds that found
// nothing.
func (f *fakeDelayed) counts() (looks, rounds, empty int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.looks, len(f.rounds), f.empty
}

// runFakeSweeper runs runSweeper on f until the test ends; the stream's
// start is fixed at once. It returns the pipeline, whose due hint is the
// stream's.
func runFakeSweeper(t *testing.T, f *fakeDelayed) *pipeline {
	t.Helper()
	p := startFakeSweeper(t, f)
	p.markPositioned()
	return p
}

// startFakeSweeper is runFakeSweeper with the stream's start not yet fixed.
func startFakeSweeper(t *testing.T, f *fakeDelayed) *pipeline {
	t.Helper()
	p := &pipeline{r: unitRelay(t, newFakeStore(), nil), leader: newFakeLease(1), due: newDueHint(), positioned: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.runSweeper(ctx, stop, f, sweepInterval)
	}()
	t.Cleanup(func() {
		close(stop)
		cancel()
		<-done
	})
	return p
}

// deliveredOnTime waits for n deliveries and fails on one before its due
// time or later than the poll interval (and the test machine's slack)
// after it.
func deliveredOnTime(t *testing.T, f *fakeDelayed, n int) {
	t.Helper()
	for range n {
		d := within(t, "a delayed row is delivered", f.delivered)
		if d.after < 0 || d.after > sweepInterval+slack {
			t.Errorf("row due at %s delivered %v after it, want within [0, %v]", d.due.Format(time.StampMicro), d.after, sweepInterval+slack)
		}
	}
}

// A term that starts with delayed rows pending (a restart: the stream will
// not read them again) learns the earliest from its one look and delivers
// each row once it is due on the server's clock, whether that clock is
// ahead of the relay's, behind it, or the same: one round per due time and
// one look after each, nothing in between.
func TestUnitDelayedRestartSleepsUntilDue(t *testing.T) {
	for _, skew := range []time.Duration{0, time.Hour, -time.Hour} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			f := newFakeDelayed(skew, 100)
			f.insert(f.in(60 * time.Millisecond))
			f.insert(f.in(300 * time.Millisecond))
			runFakeSweeper(t, f)
			deliveredOnTime(t, f, 2)
			_, rounds, _ := f.counts()
			for range rounds + 1 { // a look at the start and after each round
				within(t, "a look", f.looked)
			}
			// One round per due time (one for both if the machine woke
			// it late), none that found nothing, and no look between.
			if looks, rounds, empty := f.counts(); rounds > 2 || empty != 0 || looks != rounds+1 {
				t.Fatalf("%d looks and %d rounds (%d empty) for two rows due at two times, want a round per due time and a look after each", looks, rounds, empty)
			}
		})
	}
}

// With nothing pending the sweep looks once and then sends nothing until
// the stream reads a delayed row; a row the stream reads that is due sooner
// than the one it sleeps for wakes it at that row's time, and the later
// row waits.
func TestUnitDelayedRowDueSoonerWakesTheSweep(t *testing.T) {
	t.Parallel()
	f := newFakeDelayed(time.Hour, 100)
	p := runFakeSweeper(t, f)
	within(t, "the first look", f.looked)
	time.Sleep(3 * sweepInterval) // the window in which nothing must be sent
	if looks, rounds, _ := f.counts(); looks != 1 || rounds != 0 {
		t.Fatalf("with no delayed row: %d looks and %d rounds, want the one look", looks, rounds)
	}
	later := f.in(time.Hour)
	f.insert(later)
	p.due.offer(later)
	sooner := f.in(50 * time.Millisecond)
	f.insert(sooner)
	p.due.offer(sooner)
	deliveredOnTime(t, f, 1)
	within(t, "the look after the round", f.looked)
	time.Sleep(3 * sweepInterval) // the hour-later row's wait: nothing sent
	if looks, rounds, empty := f.counts(); looks != 2 || rounds != 1 || empty != 0 {
		t.Fatalf("%d looks and %d rounds (%d empty), want one round for the sooner row and one look after it", looks, rounds, empty)
	}
}

// Rows already due when the term starts go out at once (within the
// poll interval); when they are more
// than a round takes, the rounds come one poll interval apart.
func TestUnitDelayedAlreadyDueAtStart(t *testing.T) {
	t.Parallel()
	f := newFakeDelayed(-time.Minute, 2)
	for range 4 {
		f.insert(f.in(-time.Hour))
	}
	start := time.Now()
	runFakeSweeper(t, f)
	for range 4 {
		within(t, "a due row is delivered", f.delivered)
	}
	f.mu.Lock()
	rounds := slices.Clone(f.rounds)
	f.mu.Unlock()
	if len(rounds) != 2 {
		t.Fatalf("%d rounds for 4 due rows two a round, want 2", len(rounds))
	}
	if first := rounds[0].Add(-f.skew).Sub(start); first > sweepInterval+slack {
		t.Errorf("first round %v after the start, want at once", first)
	}
	if gap := rounds[1].Sub(rounds[0]); gap < sweepInterval {
		t.Errorf("rounds %v apart, want at least the poll interval %v", gap, sweepInterval)
	}
}

// The sweep's first look waits until the stream's start is fixed (a first
// start's snapshot Gs): a row committed after that look is one the stream
// reads, one committed before it is one the look finds.
func TestUnitDelayedFirstLookAfterTheStreamsStart(t *testing.T) {
	t.Parallel()
	f := newFakeDelayed(0, 100)
	p := startFakeSweeper(t, f)
	time.Sleep(3 * sweepInterval) // the window in which it must not look
	if looks, _, _ := f.counts(); looks != 0 {
		t.Fatalf("%d looks before the stream's start was fixed, want none", looks)
	}
	f.insert(f.in(10 * time.Millisecond))
	p.markPositioned()
	deliveredOnTime(t, f, 1)
}
