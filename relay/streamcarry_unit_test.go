package relay

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/streams"
)

// carryMID is the message id the carry tests give partition i's id.
func carryMID(i int, id uint64) outbox.MessageID {
	return outbox.MessageID{0: byte(i), 1: byte(id), 2: byte(id >> 8), 15: 0xc}
}

// A term on another server than the stored ids' carries them on (a
// failover to a caught-up replica behind the same address, exactly once)
// only when every condition of streamcarry.go holds; each one failing
// alone gives fresh ids. Either way the stored ids are cleared before
// anything publishes (a carry term's ids jump to fresh ones, so no later
// term may continue the stored ones), and a carried partition with nothing
// to check (partition 1) jumps to fresh ids at once.
func TestUnitStreamCarryAcrossFailoverOnlyWhenSound(t *testing.T) {
	const parts = 2
	ctx := context.Background()
	stored := []uint64{10, 20}
	issued := []uint64{13, 20} // partition 0: 11-13 unacknowledged; partition 1: nothing above
	type setup struct {
		accept    bool
		recorded  string // the server the process's record is of
		gapAt     uint64 // partition 0's record starts over at this id (0: no gap)
		published string // what this process published (MariaDB GTIDs)
		position  position.Position
		executed  string
		strict    bool
		broker    []uint64
		resume    bool
	}
	good := func() setup {
		return setup{recorded: "server_id:1", published: "0-1-120",
			position: position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-100"},
			executed: "0-1-130,0-2-131", strict: true, broker: []uint64{13, 19}, resume: true}
	}
	cases := []struct {
		name  string
		mod   func(*setup)
		carry bool
	}{
		{"every condition holds", func(*setup) {}, true},
		{"the broker holds nothing above the stored ids", func(s *setup) { s.broker = []uint64{10, 20} }, true},
		{"--accept-lost-gtids", func(s *setup) { s.accept = true }, false},
		{"the process did not publish from the stored ids' server", func(s *setup) { s.recorded = "server_id:3" }, false},
		{"the process's record does not cover the issued ids", func(s *setup) { s.gapAt = 12 }, false},
		{"the server lacks a published transaction", func(s *setup) { s.executed = "0-1-110,0-2-111" }, false},
		{"the process published nothing", func(s *setup) { s.published = "" }, false},
		{"the stored position has two domains", func(s *setup) {
			s.position.GTIDSet, s.published, s.executed = "0-1-100,1-1-5", "0-1-120,1-1-5", "0-1-130,1-1-5"
		}, false},
		{"the server has another domain", func(s *setup) { s.executed = "0-1-130,1-2-1" }, false},
		{"the server does not run gtid_strict_mode", func(s *setup) { s.strict = false }, false},
		{"MySQL", func(s *setup) {
			s.position = position.Position{Flavor: position.FlavorMySQL, GTIDSet: "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100"}
		}, false},
		{"the broker holds an id this process did not issue", func(s *setup) { s.broker = []uint64{14, 19} }, false},
		{"not resuming from the stored position", func(s *setup) { s.resume = false }, false},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			s := good()
			c.mod(&s)
			u := startUnitPipeline(t, func(cfg *Config) {
				cfg.RelayName = "r"
				cfg.Stream = streams.Config{Stream: "s", Partitions: parts, Producer: "r"}
				cfg.AcceptLostGTIDs = s.accept
			})
			r := u.p.r
			r.serverIdentity = func(context.Context) (serverIdent, error) {
				return serverIdent{Identity: "server_id:2", ID: 2, StrictGTID: s.strict}, nil // the promoted replica
			}
			r.failover.server.(*fakeServer).executed = s.executed
			if s.published != "" {
				if err := r.failover.published.acked(position.Position{Flavor: position.FlavorMariaDB, GTIDSet: s.published}); err != nil {
					t.Fatal(err)
				}
			}
			// What this process issued on server 1 above the stored ids.
			r.streamIssued = streams.NewIssued()
			r.streamSent.reset(s.recorded, stored)
			for i := range parts {
				r.streamIssued.Note(r.cfg.Stream.ProducerName(i), issued[i])
				for id := stored[i] + 1; id <= issued[i]; id++ {
					if i == 0 && id == s.gapAt {
						r.streamSent.add(i, id+1, carryMID(i, id+1))
						break
					}
					r.streamSent.add(i, id, carryMID(i, id))
				}
			}
			u.p.pub = fakeStreamPub{fakeBinlogPub: u.pub, last: s.broker}
			u.store.mu.Lock()
			u.store.progress.Position = s.position
			u.store.progress.StreamIDs = &checkpoint.StreamIDs{Stream: "s", Partitions: parts, IDs: stored,
				Server: "server_id:1", At: s.position.String()}
			u.store.mu.Unlock()

			progress, _ := u.store.Load(ctx)
			if err := u.p.decideStreamIDs(ctx, progress, s.resume); err != nil {
				t.Fatal(err)
			}
			if err := u.p.startIDs(ctx, progress); err != nil {
				t.Fatal(err)
			}
			u.store.mu.Lock()
			cleared := len(u.store.clears) > 0
			u.store.mu.Unlock()
			carried := u.p.carry != nil
			if carried != c.carry || !cleared {
				t.Fatalf("carried %v (ids %v), stored ids cleared %v: want carried %v, cleared", carried, u.p.ids, cleared, c.carry)
			}
			if !c.carry {
				for i, id := range u.p.ids {
					if id < streams.EpochBase(u.lease.Epoch())-1 || id < max(s.broker[i], issued[i]) {
						t.Fatalf("fresh ids %v not above the broker's %v, the issued %v and the epoch's base", u.p.ids, s.broker, issued)
					}
				}
				return
			}
			base := streams.EpochBase(u.lease.Epoch())
			if want := []uint64{stored[0], base - 1}; !slices.Equal(u.p.ids, want) {
				t.Fatalf("carried ids %v, want %v (partition 1, nothing to check, jumped at the start)", u.p.ids, want)
			}
			// Until partition 0 jumped, what the term stores has no
			// server: no term continues it.
			if got := u.p.streamIDsAt(u.p.markAt(s.position, false)); got == nil || got.Server != "" {
				t.Fatalf("ids stored before every partition jumped as %+v, want them without a server", got)
			}
			// The new server's binlog gives the unacknowledged ids to the
			// same messages: they keep them; past the last issued id the
			// partition goes on fresh.
			for id := stored[0] + 1; id <= issued[0]; id++ {
				got, err := u.p.nextID(0, carryMID(0, id))
				if err != nil || got != id {
					t.Fatalf("partition 0: id %d, %v; want %d", got, err, id)
				}
			}
			if got, err := u.p.nextID(0, carryMID(0, 99)); err != nil || got != base {
				t.Fatalf("partition 0 past the issued ids: id %d, %v; want the fresh %d", got, err, base)
			}
			if got, err := u.p.nextID(0, carryMID(0, 100)); err != nil || got != base+1 {
				t.Fatalf("partition 0 after the jump: id %d, %v; want %d", got, err, base+1)
			}
			if got, err := u.p.nextID(1, carryMID(1, 77)); err != nil || got != base {
				t.Fatalf("partition 1 (nothing issued above the stored ids): id %d, %v; want the fresh %d", got, err, base)
			}
			// Every partition jumped: what this term stores is marked
			// with the new server (a linear continuation of the fresh
			// ids, as a fresh term's).
			if got := u.p.streamIDsAt(u.p.markAt(s.position, false)); got == nil || got.Server != "server_id:2" ||
				!slices.Equal(got.IDs, []uint64{base + 1, base}) {
				t.Fatalf("ids stored as %+v, want [%d %d] marked with the new server", got, base+1, base)
			}
		})
	}
}

// A carry term whose new server gives an unacknowledged id to another
// message than the old one did (a transaction missing there, or ordered
// otherwise) refuses the id before the message reaches a lane, and the
// next term numbers freshly (the record is the new server's now).
func TestUnitStreamCarryEndsTheTermOnAnotherMessage(t *testing.T) {
	ctx := context.Background()
	u := startUnitPipeline(t, func(cfg *Config) {
		cfg.RelayName = "r"
		cfg.Stream = streams.Config{Stream: "s", Partitions: 1, Producer: "r"}
	})
	r := u.p.r
	r.serverIdentity = func(context.Context) (serverIdent, error) {
		return serverIdent{Identity: "server_id:2", ID: 2, StrictGTID: true}, nil
	}
	r.failover.server.(*fakeServer).executed = "0-1-130"
	if err := r.failover.published.acked(position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-120"}); err != nil {
		t.Fatal(err)
	}
	r.streamIssued = streams.NewIssued()
	r.streamIssued.Note("r-0", 8)
	r.streamSent.reset("server_id:1", []uint64{5})
	for id := uint64(6); id <= 8; id++ {
		r.streamSent.add(0, id, carryMID(0, id))
	}
	u.p.pub = fakeStreamPub{fakeBinlogPub: u.pub, last: []uint64{8}}
	pos := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-100"}
	u.store.mu.Lock()
	u.store.progress.Position = pos
	u.store.progress.StreamIDs = &checkpoint.StreamIDs{Stream: "s", Partitions: 1, IDs: []uint64{5}, Server: "server_id:1", At: pos.String()}
	u.store.mu.Unlock()
	progress, _ := u.store.Load(ctx)
	if err := u.p.decideStreamIDs(ctx, progress, true); err != nil {
		t.Fatal(err)
	}
	if err := u.p.startIDs(ctx, progress); err != nil {
		t.Fatal(err)
	}
	if u.p.carry == nil {
		t.Fatal("not carried")
	}
	row := func(id uint64, mid outbox.MessageID) *outbox.Record {
		return &outbox.Record{ID: id, PartitionKey: "a", MessageID: mid, RoutingKey: "rk"}
	}
	if err := u.h.Row(ctx, row(1, carryMID(0, 6))); err != nil {
		t.Fatalf("the message id 6 was given: %v", err)
	}
	// Id 7's message is missing on the new server: the next message would
	// get 7. The term ends before it reaches a lane.
	if err := u.h.Row(ctx, row(2, carryMID(0, 8))); err == nil || u.p.failure() == nil || u.readCtx.Err() == nil {
		t.Fatalf("row: %v, term failure %v: want the term ended", err, u.p.failure())
	}
	u.g.Signal("lane")
	if err := u.g.Wait("lane"); err != nil {
		t.Fatal(err)
	}
	if got := u.sinks[0].published; len(got) != 1 || got[0].Seq != 6 {
		t.Fatalf("published %+v: want only the message of id 6", got)
	}
	// The next term on the new server, from the same stored ids: fresh.
	if err := u.p.decideStreamIDs(ctx, progress, true); err != nil {
		t.Fatal(err)
	}
	if err := u.p.startIDs(ctx, progress); err != nil {
		t.Fatal(err)
	}
	if u.p.carry != nil || u.p.ids[0] < streams.EpochBase(u.lease.Epoch())-1 {
		t.Fatalf("the next term carries the ids again (ids %v)", u.p.ids)
	}
}

// The record follows what the reader gives and what is stored: trimmed at
// the stored ids, kept across a restart on its server (checking each id
// given again), started over at a gap or at an id given to another message.
func TestUnitStreamSentIDsRecord(t *testing.T) {
	var s sentIDs
	s.reset("A", []uint64{0})
	for id := uint64(1); id <= 3000; id++ {
		s.add(0, id, carryMID(0, id))
	}
	s.trim("A", []uint64{2000})
	if _, ok := s.span("A", []uint64{1999}, []uint64{3000}); ok {
		t.Fatal("span covers trimmed ids")
	}
	mids, ok := s.span("A", []uint64{2000}, []uint64{3000})
	if !ok || len(mids[0]) != 1000 || mids[0][0] != carryMID(0, 2001) || mids[0][999] != carryMID(0, 3000) {
		t.Fatalf("span after trim: ok %v, %d ids", ok, len(mids[0]))
	}
	if _, ok := s.span("A", []uint64{2000}, []uint64{3001}); ok {
		t.Fatal("span covers an id never given")
	}
	if _, ok := s.span("B", []uint64{2000}, []uint64{3000}); ok {
		t.Fatal("span of another server")
	}
	// A restart on A gives 2001.. again: the same messages keep the record.
	s.add(0, 2001, carryMID(0, 2001))
	if _, ok := s.span("A", []uint64{2000}, []uint64{3000}); !ok {
		t.Fatal("an id given again to its message broke the record")
	}
	// Another message under a recorded id starts the record over there.
	s.add(0, 2002, carryMID(0, 9))
	if _, ok := s.span("A", []uint64{2000}, []uint64{3000}); ok {
		t.Fatal("span still covers after an id went to another message")
	}
	if _, ok := s.span("A", []uint64{2001}, []uint64{2002}); !ok {
		t.Fatal("the record did not start over at the id")
	}
	// With a keep time, stored ids stay recorded that long: a promoted
	// replica's progress row may lag the old primary's.
	k := sentIDs{keepFor: time.Hour}
	k.reset("A", []uint64{0})
	for id := uint64(1); id <= 10; id++ {
		k.add(0, id, carryMID(0, id))
	}
	k.trim("A", []uint64{8})
	if _, ok := k.span("A", []uint64{2}, []uint64{10}); !ok {
		t.Fatal("ids trimmed before their keep time")
	}
	// A term without a server (ids stored unmarked, never trimmed)
	// records nothing.
	s.reset("", []uint64{0})
	s.add(0, 1, carryMID(0, 1))
	if len(s.parts[0].mids) != 0 {
		t.Fatal("a term without a server recorded its ids")
	}
}
