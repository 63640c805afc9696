package relay

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
)

// In-memory fakes of the relay's seams (seams.go), for unit tests that need
// neither MariaDB nor RabbitMQ.

// fakeLease is a leadership the test controls.
type fakeLease struct {
	epoch int64

	mu      sync.Mutex
	invalid bool
	lost    chan struct{}
	err     error
	paused  *watched
}

func newFakeLease(epoch int64) *fakeLease {
	return &fakeLease{epoch: epoch, lost: make(chan struct{}), paused: newWatched(false)}
}

func (l *fakeLease) Epoch() int64 { return l.epoch }
func (l *fakeLease) Valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.invalid && l.err == nil
}
func (l *fakeLease) Lost() <-chan struct{} { return l.lost }
func (l *fakeLease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
func (l *fakeLease) Lose(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
		close(l.lost)
	}
}
func (l *fakeLease) Paused() (bool, <-chan struct{}) { return l.paused.get() }

// setPaused is an operator's pause (true) or resume (false).
func (l *fakeLease) setPaused(p bool) { l.paused.set(p) }

// watched is a boolean whose every change closes the channel get returned
// with it, as the seams' Paused and Connected promise.
type watched struct {
	mu      sync.Mutex
	v       bool
	changed chan struct{}
}

func newWatched(v bool) *watched { return &watched{v: v, changed: make(chan struct{})} }

func (w *watched) get() (bool, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.v, w.changed
}

func (w *watched) set(v bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.v = v
	close(w.changed)
	w.changed = make(chan struct{})
}

// fakeStore is a progress row in memory. Every call is recorded; changed
// receives after each Ack and MarkPaused.
type fakeStore struct {
	mu       sync.Mutex
	progress checkpoint.Progress
	acks     []checkpoint.Ack
	modes    []string // SetMode's mode, in order
	paused   []int64  // MarkPaused's epochs
	pending  map[uint64]bool
	ackErrs  []error // returned by the next Acks, in turn
	// ackStall, when set, holds every Ack (a database that stopped
	// answering) until it is closed or the Ack's ctx ends; stalled counts
	// the Acks it holds.
	ackStall chan struct{}
	stalled  int
	changed  chan struct{}
	clears   []int64 // ClearStreamIDs's epochs
}

func newFakeStore() *fakeStore {
	return &fakeStore{pending: map[uint64]bool{}, changed: make(chan struct{}, 1000)}
}

func (s *fakeStore) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *fakeStore) Load(ctx context.Context) (checkpoint.Progress, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress, nil
}

func (s *fakeStore) Ack(ctx context.Context, epoch int64, a checkpoint.Ack) error {
	s.mu.Lock()
	if stall := s.ackStall; stall != nil {
		s.stalled++
		s.mu.Unlock()
		s.notify()
		select {
		case <-stall:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	defer s.notify()
	if len(s.ackErrs) > 0 {
		err := s.ackErrs[0]
		s.ackErrs = s.ackErrs[1:]
		return err
	}
	s.acks = append(s.acks, a)
	return nil
}

func (s *fakeStore) Pending(ctx context.Context, ids []uint64) (map[uint64]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[uint64]bool{}
	for _, id := range ids {
		if s.pending[id] {
			out[id] = true
		}
	}
	return out, nil
}

func (s *fakeStore) SetMode(ctx context.Context, epoch int64, mode, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.modes = append(s.modes, mode)
	if mode != "" { // as checkpoint.Store: an empty mode records only the reason
		s.progress.Mode = mode
	}
	return nil
}

func (s *fakeStore) ClearFailed(ctx context.Context, epoch int64) error { return nil }

func (s *fakeStore) ClearStreamIDs(ctx context.Context, epoch int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clears = append(s.clears, epoch)
	s.progress.StreamIDs = nil
	return nil
}

func (s *fakeStore) MarkPaused(ctx context.Context, epoch int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.notify()
	s.paused = append(s.paused, epoch)
	return nil
}

// acked returns the ids acknowledged so far, the failed ones among them,
// and the last position stored (with the mode stored with it).
func (s *fakeStore) acked() (ids []uint64, failed map[uint64]string, lastAck checkpoint.Ack) {
	s.mu.Lock()
	defer s.mu.Unlock()
	failed = map[uint64]string{}
	for _, a := range s.acks {
		for _, r := range a.IDs {
			for id := r.Lo; id <= r.Hi; id++ {
				ids = append(ids, id)
			}
		}
		for _, f := range a.Failed {
			failed[f.Record.ID] = f.Reason
		}
		if a.HasPos {
			lastAck = a
		}
	}
	return ids, failed, lastAck
}

// until waits, at most 5 s, until cond holds; cond is checked at once and
// after every change of the store.
func (s *fakeStore) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-s.changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// fakeSink is a lane's sink: it keeps what was published, and the test
// gives each message its result (resolve), as the broker's confirms would.
type fakeSink struct {
	mu        sync.Mutex
	published []publish.Message
	pubIDs    []uint64 // the outbox id of each of published (a ticket forgets its row once resolved)
	onResult  func(publish.Result)
	sent      chan struct{}
}

func newFakeSink(onResult func(publish.Result)) *fakeSink {
	return &fakeSink{onResult: onResult, sent: make(chan struct{}, 1000)}
}

func (s *fakeSink) Publish(ctx context.Context, m publish.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	s.published = append(s.published, m)
	s.pubIDs = append(s.pubIDs, m.Tag.(*ticket).Record().ID)
	s.mu.Unlock()
	s.sent <- struct{}{}
	return nil
}

// ids returns the outbox ids published, in publish order.
func (s *fakeSink) ids() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.pubIDs)
}

// resolve gives the message of outbox id its outcome.
func (s *fakeSink) resolve(t *testing.T, id uint64, o publish.Outcome, reason string) {
	t.Helper()
	s.mu.Lock()
	var tag any
	for i, m := range s.published {
		if s.pubIDs[i] == id {
			tag = m.Tag
		}
	}
	s.mu.Unlock()
	if tag == nil {
		t.Fatalf("id %d was never published", id)
	}
	s.onResult(publish.Result{Tag: tag, Outcome: o, Reason: reason})
}

// fakeServer is a server's executed GTIDs.
type fakeServer struct {
	mu       sync.Mutex
	executed string
}

func (s *fakeServer) Addr() string                               { return "replica:3306" }
func (s *fakeServer) Flavor(ctx context.Context) (string, error) { return "mariadb", nil }
func (s *fakeServer) ExecutedGTIDs(ctx context.Context, flavor string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executed, nil
}

// unitRelay is a Relay wired to fakes only: no pool, no broker.
func unitRelay(t *testing.T, store *fakeStore, mod func(*Config)) *Relay {
	t.Helper()
	cfg := Config{MySQLDSN: "u@tcp(127.0.0.1:3306)/db", AMQPURL: "amqp://guest:guest@127.0.0.1:5672/",
		Logger: zaptest.NewLogger(t), CheckpointInterval: time.Hour}
	if mod != nil {
		mod(&cfg)
	}
	cfg.SetDefaults()
	log := cfg.Logger
	f := &failoverCheck{log: log, server: &fakeServer{}}
	if cfg.StateFile != "" {
		f.state = &stateFile{path: cfg.StateFile, relayName: cfg.RelayName}
	}
	return &Relay{cfg: cfg, log: log, progress: store, failover: f, tablesShape: func(context.Context) error { return nil }}
}

// rec is an outbox row of partition key.
func rec(id uint64, key string) *outbox.Record {
	return &outbox.Record{ID: id, PartitionKey: key, MessageID: outbox.MessageID{0: byte(id), 15: byte(id >> 8)}, RoutingKey: "rk"}
}

// errLeaseExpiredForTest is what a lane ends with when the lease may have
// expired (the one place these tests name leadership's error).
var errLeaseExpiredForTest = leadership.ErrLeaseExpired

// fakeBroker is a publisher's connection to the broker, up until the test
// sets it down.
type fakeBroker struct{ up *watched }

func newFakeBroker() *fakeBroker { return &fakeBroker{up: newWatched(true)} }

func (b *fakeBroker) Connected() (bool, <-chan struct{}) { return b.up.get() }

// setDown loses (true) or restores (false) the connection.
func (b *fakeBroker) setDown(down bool) { b.up.set(!down) }
