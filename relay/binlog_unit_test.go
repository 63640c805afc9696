package relay

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Unit tests on fakes of a whole binlog mode run (runBinlog): its wiring of
// the publisher, the lanes, the acker and reading, and its one shutdown
// policy on a shutdown, a fallback and a lost leadership.

// fakeBinlogPub is binlog mode's publisher: a fake sink per lane, no
// delayed rows, and the sweep before tailing drainer (none when nil: the
// runs resume from a stored position).
type fakeBinlogPub struct {
	*fakeBroker
	drainer  drainer
	mu       sync.Mutex
	sinks    []*fakeSink
	sent     chan struct{} // receives on every publish of every sink
	closed   atomic.Bool
	closeErr error // what Close returns
}

func (p *fakeBinlogPub) NewSink(onResult func(publish.Result)) (sink, error) {
	s := newFakeSink(onResult)
	s.sent = p.sent
	p.mu.Lock()
	p.sinks = append(p.sinks, s)
	p.mu.Unlock()
	return s, nil
}

func (p *fakeBinlogPub) Drainer() (drainer, error) {
	if p.drainer == nil {
		return nil, errors.New("no sweep in this test")
	}
	return p.drainer, nil
}

func (p *fakeBinlogPub) DelayedSweeper() (delayedSweeper, time.Duration, error) {
	return noDelayed{}, time.Hour, nil
}

func (p *fakeBinlogPub) Close() error { p.closed.Store(true); return p.closeErr }

// published returns how many messages all sinks published.
func (p *fakeBinlogPub) published() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.sinks {
		n += len(s.ids())
	}
	return n
}

// waitPublished waits until n messages were published.
func (p *fakeBinlogPub) waitPublished(t *testing.T, n int) {
	t.Helper()
	for p.published() < n {
		within(t, "a publish", p.sent)
	}
}

// confirm gives the message of outbox id its confirm, from its sink.
func (p *fakeBinlogPub) confirm(t *testing.T, id uint64) {
	t.Helper()
	p.mu.Lock()
	var of *fakeSink
	for _, s := range p.sinks {
		for _, got := range s.ids() {
			if got == id {
				of = s
			}
		}
	}
	p.mu.Unlock()
	if of == nil {
		t.Fatalf("id %d was never published", id)
	}
	of.resolve(t, id, publish.Confirmed, "")
}

// noDelayed is a due-time sweep that finds no delayed rows.
type noDelayed struct{}

func (noDelayed) Earliest(context.Context) (time.Time, time.Time, error) {
	return time.Time{}, time.Now(), nil
}
func (noDelayed) Round(context.Context) (int, error) { return 0, nil }
func (noDelayed) Close() error                       { return nil }

// binlogRun is a runBinlog under way on fakes.
type binlogRun struct {
	r     *Relay
	store *fakeStore
	pub   *fakeBinlogPub
	lease *fakeLease
	stop  func() // the shutdown
	next  chan *modeSwitch
	err   chan error
}

// startBinlogRun runs binlog mode on src, resuming from position 50.
func startBinlogRun(t *testing.T, src *scriptSource, mod func(*Config)) *binlogRun {
	t.Helper()
	store := newFakeStore()
	store.progress.Position = filePos(50)
	b := &binlogRun{store: store, lease: newFakeLease(8), next: make(chan *modeSwitch, 1), err: make(chan error, 1),
		pub: &fakeBinlogPub{fakeBroker: newFakeBroker(), sent: make(chan struct{}, 1000)}}
	b.r = unitRelay(t, store, func(c *Config) {
		c.Lanes = 4
		if mod != nil {
			mod(c)
		}
	})
	b.r.binlog = fakeBinlog{src: src}
	b.launch(t)
	return b
}

// launch runs binlog mode on b.pub in a goroutine; b.stop shuts it down.
func (b *binlogRun) launch(t *testing.T) {
	b.r.openBinlog = func(context.Context, lease) (binlogPublisher, error) { return b.pub, nil }
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	b.stop = stop
	go func() {
		next, err := b.r.runBinlog(ctx, b.lease)
		b.next <- next
		b.err <- err
	}()
}

// result waits for the run's end.
func (b *binlogRun) result(t *testing.T) (*modeSwitch, error) {
	t.Helper()
	next := within(t, "the binlog mode run ends", b.next)
	return next, <-b.err
}

// A shutdown ends reading at a transaction boundary, waits for the
// in-flight confirms, acknowledges them in a final round, closes the
// publisher and ends the run without a switch.
func TestUnitRunBinlogShutdown(t *testing.T) {
	b := startBinlogRun(t, &scriptSource{txns: []txn{
		{rows: []*outbox.Record{rec(1, "a"), rec(2, "b")}, pos: filePos(100)},
		{rows: []*outbox.Record{rec(3, "c")}, pos: filePos(200)},
	}}, nil)
	b.pub.waitPublished(t, 3)
	b.pub.confirm(t, 1)
	b.pub.confirm(t, 2)
	b.stop()
	b.pub.confirm(t, 3) // in flight when the shutdown came
	next, err := b.result(t)
	if next != nil || err != nil {
		t.Fatalf("shutdown: switch %+v, error %v; want neither", next, err)
	}
	if _, _, last := b.store.acked(); last.Pos != filePos(200) {
		t.Fatalf("stored %v, want %v: the final round acknowledges what was in flight", last.Pos, filePos(200))
	}
	if !b.pub.closed.Load() || b.r.Tailing() {
		t.Fatalf("after the run: publisher closed %v, tailing %v", b.pub.closed.Load(), b.r.Tailing())
	}
}

// A publisher whose close fails at the end of a run (a stream connection
// that did not close in time) does not change how the run ended, and its
// error is logged, not dropped.
func TestUnitRunBinlogLogsAFailedClose(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	src := &scriptSource{txns: []txn{{rows: []*outbox.Record{rec(1, "a")}, pos: filePos(100)}}}
	store := newFakeStore()
	store.progress.Position = filePos(50)
	b := &binlogRun{store: store, lease: newFakeLease(8), next: make(chan *modeSwitch, 1), err: make(chan error, 1),
		pub: &fakeBinlogPub{fakeBroker: newFakeBroker(), sent: make(chan struct{}, 1000),
			closeErr: errors.New("close the stream connection: timed out")}}
	b.r = unitRelay(t, store, func(c *Config) { c.Logger = zap.New(core) })
	b.r.binlog = fakeBinlog{src: src}
	b.launch(t)
	b.pub.waitPublished(t, 1)
	b.pub.confirm(t, 1)
	b.stop()
	if next, err := b.result(t); next != nil || err != nil {
		t.Fatalf("shutdown: switch %+v, error %v; want neither", next, err)
	}
	found := logs.FilterMessageSnippet("close binlog mode's publisher failed").FilterFieldKey("error").All()
	if len(found) != 1 || !strings.Contains(found[0].ContextMap()["error"].(string), "timed out") {
		t.Fatalf("logged %v; want one warning with the close's error", logs.All())
	}
}

// In --mode auto a binlog the relay cannot read (here purged) ends the run
// with a switch to poll mode once what was published is confirmed and
// acknowledged; the reason is the binlog's error.
func TestUnitRunBinlogFallback(t *testing.T) {
	purged := &canal.PurgedError{Detail: "binlog.000001 was purged"}
	b := startBinlogRun(t, &scriptSource{txns: []txn{
		{rows: []*outbox.Record{rec(1, "a")}, pos: filePos(100)},
	}, end: purged}, func(c *Config) { c.Mode = ModeAuto })
	b.pub.waitPublished(t, 1)
	b.pub.confirm(t, 1)
	next, err := b.result(t)
	if err != nil || next == nil || next.to != ModePoll || !strings.Contains(next.reason, "purged") {
		t.Fatalf("switch %+v, error %v; want a switch to poll mode saying the binlog was purged", next, err)
	}
	if _, _, last := b.store.acked(); last.Pos != filePos(100) {
		t.Fatalf("stored %v before polling, want %v", last.Pos, filePos(100))
	}
}

// A lost leadership ends the run at once with the loss: publishing stops
// without waiting for confirms, and nothing unconfirmed is acknowledged
// (the next leader publishes it again).
func TestUnitRunBinlogLeadershipLost(t *testing.T) {
	b := startBinlogRun(t, &scriptSource{txns: []txn{
		{rows: []*outbox.Record{rec(1, "a")}, pos: filePos(100)},
	}}, nil)
	b.pub.waitPublished(t, 1)
	lost := errors.New("lease lost")
	b.lease.Lose(lost)
	next, err := b.result(t)
	if next != nil || !errors.Is(err, lost) {
		t.Fatalf("switch %+v, error %v; want the loss", next, err)
	}
	if ids, _, last := b.store.acked(); len(ids) > 0 || last.HasPos {
		t.Fatalf("acknowledged %v at %v after losing leadership, want nothing", ids, last.Pos)
	}
}
