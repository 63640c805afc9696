package relay

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Unit tests on fakes of the order of a leader term: nothing the term can
// publish (the lanes, the due-time sweep of delayed rows, the sweep of the
// first start or of the poll → binlog handover, poll rounds) starts before
// the term's lossy-failover check has returned, so a server that lacks
// published transactions is refused before anything goes out on it.

// checkDelay is how long the slow promoted replica of these tests takes to
// answer the failover check: a hundred intervals of the due-time sweep
// (termInterval), time enough for any path started before the check to
// publish.
const (
	checkDelay   = 100 * time.Millisecond
	termInterval = time.Millisecond
)

// termEvents records, in order, the server's answer to the failover check
// and every publish of the term, by path; published receives the path of
// every publish.
type termEvents struct {
	mu        sync.Mutex
	checked   bool
	events    []string
	early     []string // the paths that published before the check returned
	published chan string
}

func newTermEvents() *termEvents { return &termEvents{published: make(chan string, 1000)} }

func (e *termEvents) answered() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.checked = true
	e.events = append(e.events, "check")
}

func (e *termEvents) publish(path string) {
	e.mu.Lock()
	e.events = append(e.events, path)
	if !e.checked {
		e.early = append(e.early, path)
	}
	e.mu.Unlock()
	select {
	case e.published <- path:
	default:
	}
}

// report returns what was recorded: every event in order, and the publishes
// that came before the check.
func (e *termEvents) report() (events, early []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.events...), append([]string(nil), e.early...)
}

// slowReplica is a promoted replica that takes checkDelay to say which
// GTIDs it has executed.
type slowReplica struct {
	fakeServer
	ev *termEvents
}

func (s *slowReplica) ExecutedGTIDs(ctx context.Context, flavor string) (string, error) {
	t := time.NewTimer(checkDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	defer s.ev.answered()
	return s.fakeServer.ExecutedGTIDs(ctx, flavor)
}

// recordingPub is binlog mode's publisher whose every path records its
// publishes: the lanes' sinks, the sweep before tailing (one row) and a
// due-time sweep with one delayed row due.
type recordingPub struct {
	*fakeBinlogPub
	ev *termEvents
}

func (p recordingPub) NewSink(onResult func(publish.Result)) (sink, error) {
	s, err := p.fakeBinlogPub.NewSink(onResult)
	return recordingSink{sink: s, ev: p.ev}, err
}

func (p recordingPub) Drainer() (drainer, error) {
	return fakeDrainer(func(ctx context.Context, stop <-chan struct{}) (int, error) {
		p.ev.publish("sweep before tailing")
		return 1, nil
	}), nil
}

func (p recordingPub) DelayedSweeper() (delayedSweeper, time.Duration, error) {
	return &dueRow{ev: p.ev}, termInterval, nil
}

type recordingSink struct {
	sink
	ev *termEvents
}

func (s recordingSink) Publish(ctx context.Context, m publish.Message) error {
	s.ev.publish("lane")
	return s.sink.Publish(ctx, m)
}

// dueRow is a due-time sweep with one delayed row, due: its first round
// delivers it.
type dueRow struct {
	ev        *termEvents
	delivered atomic.Bool
}

func (d *dueRow) Earliest(context.Context) (time.Time, time.Time, error) {
	now := time.Now()
	if d.delivered.Load() {
		return time.Time{}, now, nil
	}
	return now, now, nil
}
func (d *dueRow) Round(context.Context) (int, error) {
	if d.delivered.Swap(true) {
		return 0, nil
	}
	d.ev.publish("due-time sweep")
	return 1, nil
}
func (*dueRow) Close() error { return nil }

// recordingRounds is poll mode's poller: a round publishes at once, then
// it waits to be stopped.
type recordingRounds struct{ ev *termEvents }

func (r recordingRounds) RunUntil(ctx context.Context, stop <-chan struct{}) error {
	r.ev.publish("poll round")
	select {
	case <-stop:
	case <-ctx.Done():
	}
	return nil
}

// termCase is a leader term's start: its mode, the stored progress row and
// what this process published before (a GTID set, "" for nothing).
type termCase struct {
	name      string
	mode      Mode
	stored    position.Position
	storedAs  Mode // the mode stored with it ("" or poll: the handover)
	published string
	want      []string // the paths that must publish once the check has passed
}

// runTerm runs a leader term of tc (runModes, as lead does) on a server
// that has executed executed, until the term ends by itself or, once every
// path of tc.want has published, until the test stops it; it returns the
// term's error.
func runTerm(t *testing.T, tc termCase, ev *termEvents, executed string) error {
	t.Helper()
	store := newFakeStore()
	store.progress.Position, store.progress.Mode = tc.stored, string(tc.storedAs)
	r := unitRelay(t, store, func(c *Config) {
		// What a lane published is never confirmed here: the stop does not
		// wait for it.
		c.Mode, c.Lanes, c.ShutdownTimeout = tc.mode, 2, time.Millisecond
	})
	r.failover.server = &slowReplica{fakeServer: fakeServer{executed: executed}, ev: ev}
	if tc.published != "" {
		if err := r.failover.published.load(mariaPos(tc.published), "an earlier term"); err != nil {
			t.Fatal(err)
		}
	}
	now := func() (position.Position, error) { return mariaPos(executed), nil }
	r.binlog = fakeBinlog{snapshot: now, src: &scriptSource{txns: []txn{
		{rows: []*outbox.Record{rec(1, "a")}, pos: mariaPos(executed)},
	}}}
	pub := recordingPub{fakeBinlogPub: &fakeBinlogPub{fakeBroker: newFakeBroker(), sent: make(chan struct{}, 1000)}, ev: ev}
	r.openBinlog = func(context.Context, lease) (binlogPublisher, error) { return pub, nil }
	r.openPoll = func(context.Context, lease) (pollPublisher, rounds, error) {
		return &fakePollPub{fakeBroker: newFakeBroker()}, recordingRounds{ev}, nil
	}
	r.modes = modeRunners{start: r.startMode, binlog: r.runBinlog, poll: r.runPoll}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- r.runModes(ctx, newFakeLease(3)) }()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for missing := slices.Clone(tc.want); len(missing) > 0; {
		select {
		case err := <-done:
			return err
		case path := <-ev.published:
			missing = slices.DeleteFunc(missing, func(p string) bool { return p == path })
		case <-deadline.C:
			t.Fatalf("the term neither ended nor published by %v", missing)
		}
	}
	stop()
	return within(t, "the term stops", done)
}

var termCases = []termCase{
	{name: "binlog mode resumes: the lanes and the due-time sweep", mode: ModeBinlog,
		stored: mariaPos("0-1-10"), want: []string{"lane", "due-time sweep"}},
	{name: "binlog mode's first start: its sweep", mode: ModeBinlog,
		published: "0-1-10", want: []string{"sweep before tailing"}},
	{name: "the handover to binlog mode: its sweep", mode: ModeBinlog,
		stored: mariaPos("0-1-10"), storedAs: ModePoll, want: []string{"sweep before tailing"}},
	{name: "poll mode: its rounds", mode: ModePoll,
		stored: mariaPos("0-1-10"), want: []string{"poll round"}},
}

// On a promoted replica that lacks published transactions and is slow to
// say so, every kind of term is refused with a *LostGTIDsError naming them,
// and nothing is published: no path starts before the check returns.
func TestUnitNothingPublishedBeforeTheCheck(t *testing.T) {
	for _, tc := range termCases {
		t.Run(tc.name, func(t *testing.T) {
			ev := newTermEvents()
			err := runTerm(t, tc, ev, "0-1-5")
			events, early := ev.report()
			if len(early) > 0 {
				t.Errorf("published by %v before the failover check returned (events in order: %v)", early, events)
			}
			var lost *LostGTIDsError
			if !errors.As(err, &lost) || lost.Missing != "0-1-6..0-1-10" {
				t.Fatalf("the term ended with %v; want the lossy failover refused, 0-1-6..0-1-10 missing", err)
			}
			if len(events) != 1 {
				t.Fatalf("events %v; want the check only, nothing published on the lossy server", events)
			}
		})
	}
}

// On a server that holds everything, the same terms publish, each path
// only after the check.
func TestUnitPublishAfterTheCheck(t *testing.T) {
	for _, tc := range termCases {
		t.Run(tc.name, func(t *testing.T) {
			ev := newTermEvents()
			if err := runTerm(t, tc, ev, "0-1-12"); err != nil {
				t.Fatalf("term: %v", err)
			}
			events, early := ev.report()
			if len(early) > 0 || len(events) < 2 || events[0] != "check" {
				t.Fatalf("events %v (early: %v); want the check, then the publishes of %v", events, early, tc.want)
			}
		})
	}
}

// silentReplica never answers the failover check; asked says it was asked.
type silentReplica struct {
	fakeServer
	asked chan struct{}
}

func (s *silentReplica) ExecutedGTIDs(ctx context.Context, flavor string) (string, error) {
	close(s.asked)
	<-ctx.Done()
	return "", ctx.Err()
}

// A shutdown while the check waits for the server ends binlog mode at once,
// without an error and with nothing started: no term has anything under
// way yet to finish.
func TestUnitShutdownDuringTheCheck(t *testing.T) {
	store := newFakeStore()
	store.progress.Position = mariaPos("0-1-10")
	r := unitRelay(t, store, func(c *Config) { c.Mode = ModeBinlog })
	srv := &silentReplica{asked: make(chan struct{})}
	r.failover.server = srv
	opened := false
	r.openBinlog = func(context.Context, lease) (binlogPublisher, error) {
		opened = true
		return nil, errors.New("not in this test")
	}
	ctx, shutdown := context.WithCancel(context.Background())
	type end struct {
		next *modeSwitch
		err  error
	}
	done := make(chan end, 1)
	go func() {
		next, err := r.runBinlog(ctx, newFakeLease(4))
		done <- end{next, err}
	}()
	<-srv.asked
	shutdown()
	if e := within(t, "binlog mode ends", done); e.next != nil || e.err != nil || opened {
		t.Fatalf("shutdown during the check: switch %+v, error %v, publisher opened %v; want none", e.next, e.err, opened)
	}
}
