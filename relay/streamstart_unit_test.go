package relay

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// fakeStreamPub is a binlog publisher with the stream destination's query
// of the broker's last publishing ids.
type fakeStreamPub struct {
	*fakeBinlogPub
	last []uint64 // the broker's last id per partition
}

func (f fakeStreamPub) LastIDs(ctx context.Context, prefix string) ([]uint64, error) {
	return slices.Clone(f.last), nil
}

// A term continues the stored publishing ids only when they are the
// deterministic continuation: it resumes from exactly the stored position
// (not a first start, a poll term's handover or a lossy failover), on the
// server the ids were stored on (another server may order the same GTIDs
// differently), for the same stream and partition count. Any other term
// numbers freshly, from max(broker's last + 1, epoch<<40, this process's
// highest issued + 1) per producer, so no older publisher's in-flight id is
// reused (finding 1), and clears the stored ids in the fenced progress row
// before it publishes, so a later term never continues ids that this term
// pushed the producers past (finding 2).
func TestUnitStreamIDsContinueOnlyTheirOwnContinuation(t *testing.T) {
	u := startUnitPipeline(t, func(c *Config) {
		c.RelayName = "r"
		c.Stream = streams.Config{Stream: "s", Partitions: 3, Producer: "r"}
	})
	ctx := context.Background()
	base := streams.EpochBase(u.lease.Epoch())
	issued := streams.NewIssued()
	issued.Note("r-2", base+10) // an earlier term of this process, not drained
	u.p.r.streamIssued = issued
	server := "uuid:A"
	u.p.r.serverIdentity = func(context.Context) (serverIdent, error) { return serverIdent{Identity: server}, nil }
	u.p.pub = fakeStreamPub{fakeBinlogPub: u.pub, last: []uint64{5, base + 3, 0}}

	progress0, _ := u.store.Load(ctx)
	at := storedPosition(progress0).String()
	// Consistent with the broker and the issued ids (a continuation's
	// guards, TestUnitStreamContinuationGuards, pass).
	stored := &checkpoint.StreamIDs{Stream: "s", Partitions: 3, IDs: []uint64{4, base + 8, base + 12}, Server: "uuid:A", At: at}
	// A binary older than the stream destination moved the position and
	// left the ids (a rolling downgrade, then the upgrade again).
	moved := &checkpoint.StreamIDs{Stream: "s", Partitions: 3, IDs: stored.IDs, Server: "uuid:A", At: at + ",0-1-1"}
	fresh := []uint64{base - 1, base + 3, base + 10}
	cases := []struct {
		name   string
		ids    *checkpoint.StreamIDs
		resume bool
		server string
		want   []uint64
	}{
		{"resume on the same server", stored, true, "uuid:A", stored.IDs},
		{"resume on another server", stored, true, "uuid:B", fresh},
		{"position moved without the ids", moved, true, "uuid:A", fresh},
		{"first start, poll term or lossy failover", stored, false, "uuid:A", fresh},
		{"no stored ids", nil, true, "uuid:A", fresh},
		{"another partition count", &checkpoint.StreamIDs{Stream: "s", Partitions: 2, IDs: []uint64{4, 8}, Server: "uuid:A"}, true, "uuid:A", fresh},
		{"another stream", &checkpoint.StreamIDs{Stream: "t", Partitions: 3, IDs: []uint64{4, 8, 9}, Server: "uuid:A"}, true, "uuid:A", fresh},
		{"ids stored without their server", &checkpoint.StreamIDs{Stream: "s", Partitions: 3, IDs: []uint64{4, 8, 9}}, true, "uuid:A", fresh},
	}
	for _, c := range cases {
		server = c.server
		u.store.mu.Lock()
		u.store.progress.StreamIDs = c.ids
		clearsBefore := len(u.store.clears)
		u.store.mu.Unlock()
		progress, _ := u.store.Load(ctx)
		if err := u.p.decideStreamIDs(ctx, progress, c.resume); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := u.p.startIDs(ctx, progress); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !slices.Equal(u.p.ids, c.want) {
			t.Errorf("%s: ids %v, want %v", c.name, u.p.ids, c.want)
		}
		u.store.mu.Lock()
		cleared := len(u.store.clears) > clearsBefore
		u.store.mu.Unlock()
		if continues := slices.Equal(c.want, stored.IDs); cleared == continues {
			t.Errorf("%s: stored ids cleared %v, want %v", c.name, cleared, !continues)
		}
		// What this term stores is marked with its server.
		if got := u.p.streamIDsAt(mark{ids: []uint64{1, 2, 3}}); got == nil || got.Server != c.server {
			t.Errorf("%s: ids stored as %+v, want them marked with server %s", c.name, got, c.server)
		}
	}

	// A position inside a handover window stores no ids and mode poll: a
	// term resuming from it would not filter the rows the window filtered.
	if got := u.p.streamIDsAt(mark{ids: []uint64{1, 2, 3}, handover: true}); got != nil {
		t.Errorf("ids stored with a position inside the handover window: %+v", got)
	}
	if m := u.p.ackMode(mark{handover: true}); m != ModePoll {
		t.Errorf("mode stored with a position inside the handover window: %q", m)
	}
}

// A binlog stream that reconnects to another server (a VIP moved) ends the
// term with the stream destination: the ids the term would store were read
// on the first server, and the next term decides afresh (finding 3).
func TestUnitStreamReconnectToAnotherServerEndsTheTerm(t *testing.T) {
	r := unitRelay(t, newFakeStore(), func(c *Config) { c.Stream = streams.Config{Stream: "s", Partitions: 1, Producer: "r"} })
	server := "uuid:A"
	r.serverIdentity = func(context.Context) (serverIdent, error) { return serverIdent{Identity: server}, nil }
	r.streamServer.Store("uuid:A")
	if err := r.checkStreamServer(context.Background()); err != nil {
		t.Fatalf("same server: %v", err)
	}
	server = "uuid:B"
	var stop *canal.StopError
	if err := r.checkStreamServer(context.Background()); !errors.As(err, &stop) {
		t.Fatalf("another server: %v, want a *canal.StopError", err)
	}
}

// A poll term clears the stored stream ids before it publishes (its ids do
// not continue them), fenced by its epoch (finding 2).
func TestUnitStreamPollTermClearsTheStoredIDs(t *testing.T) {
	store := newFakeStore()
	store.progress.StreamIDs = &checkpoint.StreamIDs{Stream: "s", Partitions: 1, IDs: []uint64{9}, Server: "uuid:A"}
	r := unitRelay(t, store, func(c *Config) {
		// Nothing answers there: the term fails to connect after clearing.
		c.Stream = streams.Config{Stream: "s", Partitions: 1, Producer: "r", Window: 1, URL: "rabbitmq-stream://u:p@127.0.0.1:1/"}
	})
	if _, _, err := r.openStreamPolling(context.Background(), newFakeLease(4)); err == nil {
		t.Fatal("connected to nothing")
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if !slices.Equal(store.clears, []int64{4}) || store.progress.StreamIDs != nil {
		t.Fatalf("clears %v, stored ids %+v: want cleared by epoch 4 before publishing", store.clears, store.progress.StreamIDs)
	}
}

// Finding 7: the handover mode travels with the acknowledged position. A
// position inside the handover window whose acknowledgement comes after the
// window closed is stored with mode poll (and, with the stream destination,
// without ids): the window published only rows still pending, so a term
// resuming from there must hand over again, not continue the ids.
func TestUnitHandoverModeTravelsWithThePosition(t *testing.T) {
	u := startUnitPipeline(t, func(c *Config) { c.Stream = streams.Config{Stream: "s", Partitions: 4, Producer: "r"} })
	u.p.ids = make([]uint64, 4)
	u.store.pending[2], u.store.pending[3] = true, true // the sweep delivered 1
	u.p.mode.Store(ModePoll)
	if err := u.h.openWindow(filePos(100), filePos(300), 1<<20); err != nil {
		t.Fatal(err)
	}
	u.read(t, 3,
		txn{rows: []*outbox.Record{rec(1, "a"), rec(2, "b")}, pos: filePos(200)},
		txn{rows: []*outbox.Record{rec(3, "c")}, pos: filePos(300)},
		txn{rows: []*outbox.Record{rec(4, "d")}, pos: filePos(400)})
	if m := u.p.mode.Load().(Mode); m != ModeBinlog {
		t.Fatalf("mode after the window %q", m)
	}
	// Only the first transaction's row is confirmed: the position stored is
	// 200, inside the window, acknowledged after it closed.
	part := map[uint64]int{}
	for i, s := range u.sinks {
		for _, id := range s.ids() {
			part[id] = i
		}
	}
	u.sinks[part[2]].resolve(t, 2, publish.Confirmed, "")
	u.store.until(t, "position 200 is acknowledged", func() bool {
		_, _, last := u.store.acked()
		return last.HasPos && last.Pos == filePos(200)
	})
	if _, _, last := u.store.acked(); last.Mode != string(ModePoll) || last.StreamIDs != nil {
		t.Fatalf("position inside the window stored with mode %q and ids %+v, want poll and none", last.Mode, last.StreamIDs)
	}
}

// Finding C: the identity that decides whether the stored ids continue is
// read over a pooled connection before the first dump; the address may
// move in between, or the pool may still reach the old server. The first
// dump's own server_id (its first event's header) is checked too: another
// server ends the term, and the next term, whose pool may still read the
// old server, neither continues the ids nor marks its own with a server,
// and expects its dumps on the server the last one was on.
func TestUnitStreamFirstDumpOnAnotherServerEndsTheTerm(t *testing.T) {
	u := startUnitPipeline(t, func(c *Config) {
		c.RelayName = "r"
		c.Stream = streams.Config{Stream: "s", Partitions: 1, Producer: "r"}
	})
	ctx := context.Background()
	u.p.r.serverIdentity = func(context.Context) (serverIdent, error) {
		return serverIdent{Identity: "server_id:1", ID: 1}, nil // the pool reads server A
	}
	u.p.pub = fakeStreamPub{fakeBinlogPub: u.pub, last: []uint64{9}}
	progress0, _ := u.store.Load(ctx)
	stored := &checkpoint.StreamIDs{Stream: "s", Partitions: 1, IDs: []uint64{7}, Server: "server_id:1", At: storedPosition(progress0).String()}
	decide := func() {
		t.Helper()
		u.store.mu.Lock()
		u.store.progress.StreamIDs = stored
		u.store.mu.Unlock()
		progress, _ := u.store.Load(ctx)
		if err := u.p.decideStreamIDs(ctx, progress, true); err != nil {
			t.Fatal(err)
		}
	}
	decide()
	if !u.p.streamCont {
		t.Fatal("the stored ids of the pool's server are not continued")
	}
	if err := u.p.r.checkDumpServer(1); err != nil {
		t.Fatalf("first dump on the term's server: %v", err)
	}
	// The first dump is on server B (server_id 2).
	var stop *canal.StopError
	if err := u.p.r.checkDumpServer(2); !errors.As(err, &stop) {
		t.Fatalf("first dump on another server: %v, want a *canal.StopError ending the term", err)
	}

	// The next term: the pool still reads A.
	decide()
	if u.p.streamCont {
		t.Fatal("the next term continues server A's ids though its dump was on B")
	}
	if got := u.p.streamIDsAt(mark{ids: []uint64{11}}); got == nil || got.Server != "" {
		t.Fatalf("ids stored as %+v, want them unmarked (never continued)", got)
	}
	if err := u.p.r.checkDumpServer(2); err != nil {
		t.Fatalf("dump on the server the last dump was on: %v", err)
	}
	if err := u.p.r.checkDumpServer(1); !errors.As(err, &stop) {
		t.Fatalf("dump on A after deciding for B: %v, want a *canal.StopError", err)
	}
}
