package relay

import (
	"context"
	"testing"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// The terms after a carry term (streamcarry.go) must never continue ids
// below the fresh ones the carry term pushed a producer to: the broker
// drops every message whose id is not above the highest it stored for the
// producer, so such a continuation loses every new message of the
// partition. These tests are the review's loss paths (F1-F3) and the
// guards of a plain continuation.

// startCarryTerm sets up the common scenario: this process published, on
// server_id:1, partition 0's ids 6..issued (messages carryMID(0, id))
// above the stored 5, and the broker holds up to issued; the address now
// reaches the
// promoted replica server_id:2 (MariaDB, one domain, gtid_strict_mode),
// and a term resuming from the stored position starts there as a carry
// term.
func startCarryTerm(t *testing.T, issued uint64) *unitPipeline {
	t.Helper()
	u := startUnitPipeline(t, func(cfg *Config) {
		cfg.RelayName = "r"
		cfg.Stream = streams.Config{Stream: "s", Partitions: 1, Producer: "r"}
	})
	r := u.p.r
	setServer(u, "server_id:2", 2)
	r.failover.server.(*fakeServer).executed = "0-1-130"
	if err := r.failover.published.acked(position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-120"}); err != nil {
		t.Fatal(err)
	}
	r.streamIssued = streams.NewIssued()
	r.streamIssued.Note("r-0", issued)
	r.streamSent.reset("server_id:1", []uint64{5})
	for id := uint64(6); id <= issued; id++ {
		r.streamSent.add(0, id, carryMID(0, id))
	}
	setBrokerLast(u, max(issued, 5))
	pos := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-100"}
	u.store.mu.Lock()
	u.store.progress.Position = pos
	u.store.progress.StreamIDs = &checkpoint.StreamIDs{Stream: "s", Partitions: 1, IDs: []uint64{5}, Server: "server_id:1", At: pos.String()}
	u.store.mu.Unlock()
	nextTerm(t, u)
	if u.p.carry == nil {
		t.Fatal("the term does not carry the stored ids")
	}
	return u
}

func setServer(u *unitPipeline, identity string, id uint32) {
	u.p.r.serverIdentity = func(context.Context) (serverIdent, error) {
		return serverIdent{Identity: identity, ID: id, StrictGTID: true}, nil
	}
}

func setBrokerLast(u *unitPipeline, last uint64) {
	u.p.pub = fakeStreamPub{fakeBinlogPub: u.pub, last: []uint64{last}}
}

// nextTerm starts a term resuming from the stored progress row (deciding
// and setting its ids as a binlog term does before it publishes).
func nextTerm(t *testing.T, u *unitPipeline) {
	t.Helper()
	ctx := context.Background()
	progress, _ := u.store.Load(ctx)
	if err := u.p.decideStreamIDs(ctx, progress, true); err != nil {
		t.Fatal(err)
	}
	if err := u.p.startIDs(ctx, progress); err != nil {
		t.Fatal(err)
	}
}

// storeAck makes the progress row what an acknowledgement of position pos
// with the term's current ids stores (streamIDsAt of the reader's mark).
func storeAck(u *unitPipeline, pos position.Position) *checkpoint.StreamIDs {
	st := u.p.streamIDsAt(u.p.markAt(pos, false))
	u.store.mu.Lock()
	u.store.progress.Position = pos
	u.store.progress.StreamIDs = st
	u.store.mu.Unlock()
	return st
}

func give(t *testing.T, u *unitPipeline, mids ...uint64) []uint64 {
	t.Helper()
	var ids []uint64
	for _, m := range mids {
		id, err := u.p.nextID(0, carryMID(0, m))
		if err != nil {
			t.Fatalf("message %d: %v", m, err)
		}
		ids = append(ids, id)
	}
	return ids
}

// F1: a carry term acknowledges the transaction of id 6 (inside the checked
// range), then jumps to fresh ids F+1, F+2, which the broker stores. The
// acknowledgement stores the ids without a server, so the next term on the
// new server numbers freshly above F+2 instead of continuing 6, 7, 8, 9…
// (which the broker would drop). Once the partition jumped, the carry
// term's acknowledgements store its ids with the server again: they are a
// linear continuation of the fresh ids the broker holds, as a fresh term's.
func TestUnitStreamCarryTermStoresItsIDsUnmarkedUntilEveryPartitionJumped(t *testing.T) {
	u := startCarryTerm(t, 8)
	give(t, u, 6)
	pos6 := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-101"}
	st6 := u.p.streamIDsAt(u.p.markAt(pos6, false))
	if st6 == nil || st6.Server != "" || st6.IDs[0] != 6 {
		t.Fatalf("the ack of id 6 stores %+v, want id 6 without a server", st6)
	}
	give(t, u, 7, 8)
	fresh := give(t, u, 200, 201)
	if fresh[0] < streams.EpochBase(u.lease.Epoch()) || fresh[1] != fresh[0]+1 {
		t.Fatalf("past the checked ids: %v, want fresh ids", fresh)
	}
	posJumped := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-103"}
	if st := u.p.streamIDsAt(u.p.markAt(posJumped, false)); st == nil || st.Server != "server_id:2" || st.IDs[0] != fresh[1] {
		t.Fatalf("the ack after the jump stores %+v, want %d with the server", st, fresh[1])
	}

	// The next term on the new server resumes from the ack of id 6: fresh.
	u.store.mu.Lock()
	u.store.progress.Position = pos6
	u.store.progress.StreamIDs = st6
	u.store.mu.Unlock()
	setBrokerLast(u, fresh[1])
	nextTerm(t, u)
	if got := give(t, u, 7, 8, 200, 201, 202); got[4] <= fresh[1] || u.p.carry != nil {
		t.Fatalf("the term after an unmarked ack gives %v: want every id above the broker's last %d", got, fresh[1])
	}
}

// The ids a carry term stores once every partition jumped are continued
// on its server: the next term gives the messages after the acknowledged
// position the fresh ids the carry term gave them (the broker drops those
// it holds), and new messages the ids above.
func TestUnitStreamCarryTermJumpedIDsAreContinued(t *testing.T) {
	u := startCarryTerm(t, 8)
	give(t, u, 6, 7, 8)
	f := give(t, u, 200)
	// The ack of message 200's transaction, then the term goes on.
	pos := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-104"}
	if st := storeAck(u, pos); st.Server != "server_id:2" || st.IDs[0] != f[0] {
		t.Fatalf("stored %+v, want %d with the server", st, f[0])
	}
	f = append(f, give(t, u, 201, 202)...)
	setBrokerLast(u, f[2])
	nextTerm(t, u)
	if u.p.carry != nil || !u.p.streamCont {
		t.Fatalf("carry %v, continues %v: want a plain continuation", u.p.carry != nil, u.p.streamCont)
	}
	if got := give(t, u, 201, 202, 203); got[0] != f[1] || got[1] != f[2] || got[2] != f[2]+1 {
		t.Fatalf("continuation gives %v, want %d %d %d", got, f[1], f[2], f[2]+1)
	}
}

// A carry partition jumps with its last checked id: the counter stored
// with that transaction's position is already the fresh base, so a
// partition that goes quiet after its checked tail does not keep the
// term's ids unmarked, and the successor resuming from there gives the
// next message the fresh id the carry term gives it.
func TestUnitStreamCarryPartitionJumpsWithItsLastCheckedID(t *testing.T) {
	u := startCarryTerm(t, 8)
	base := streams.EpochBase(u.lease.Epoch())
	if got := give(t, u, 6, 7, 8); got[2] != 8 {
		t.Fatalf("the checked messages get %v, want 6 7 8", got)
	}
	pos := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-103"}
	st := storeAck(u, pos)
	if st == nil || st.Server != "server_id:2" || st.IDs[0] != base-1 {
		t.Fatalf("the ack of id 8's transaction stores %+v, want the fresh base %d with the server", st, base-1)
	}
	carried := give(t, u, 200)
	// The successor on the same server, from that ack: the message after
	// it gets the id the carry term gave it (the broker drops it), the
	// new one the id above.
	setBrokerLast(u, carried[0])
	nextTerm(t, u)
	if u.p.carry != nil || !u.p.streamCont {
		t.Fatalf("carry %v, continues %v: want a plain continuation", u.p.carry != nil, u.p.streamCont)
	}
	if got := give(t, u, 200, 201); got[0] != carried[0] || got[1] != carried[0]+1 {
		t.Fatalf("the successor gives %v, want %d %d", got, carried[0], carried[0]+1)
	}
}

// A carry partition with nothing to check (no id issued above the stored
// one) jumps when the term starts: an idle partition does not keep the
// term's ids unmarked, and its next message gets a fresh id.
func TestUnitStreamCarryIdlePartitionJumpsAtTheStart(t *testing.T) {
	u := startCarryTerm(t, 5)
	if u.p.carry.pending != 0 {
		t.Fatalf("carry %+v: want its only partition jumped at the start", u.p.carry)
	}
	pos := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-100"}
	base := streams.EpochBase(u.lease.Epoch())
	if st := u.p.streamIDsAt(u.p.markAt(pos, false)); st == nil || st.Server != "server_id:2" || st.IDs[0] != base-1 {
		t.Fatalf("stored %+v, want the fresh %d marked with the server", st, base-1)
	}
	if got := give(t, u, 300); got[0] != base {
		t.Fatalf("the next message gets %d, want the fresh %d", got[0], base)
	}
}

// F3: a carry term clears the stored ids before it publishes. A later term
// on the old server (a fail-back, or the address moving back) then
// numbers freshly above the fresh ids the carry term pushed the producer
// to, instead of continuing the old server's stored ids below them.
func TestUnitStreamCarryThenFailBackNumbersFreshly(t *testing.T) {
	u := startCarryTerm(t, 8)
	u.store.mu.Lock()
	clears, stored := len(u.store.clears), u.store.progress.StreamIDs
	u.store.mu.Unlock()
	if clears != 1 || stored != nil {
		t.Fatalf("clears %d, stored %+v: want the stored ids cleared at the carry term's start", clears, stored)
	}
	give(t, u, 6, 7, 8)
	f := give(t, u, 200)
	setServer(u, "server_id:1", 1)
	setBrokerLast(u, f[0])
	nextTerm(t, u)
	if got := give(t, u, 6, 7, 8, 200, 300); got[4] <= f[0] {
		t.Fatalf("after the fail-back: ids %v, want the new message's above the broker's last %d", got, f[0])
	}
}

// F2: the carry term acknowledges id 6's transaction (through the handler
// and the acker), then the new server's binlog gives id 7 to another
// message: the term ends. The acknowledgement stored id 6 without a
// server, so the next term on the new server numbers freshly, instead of
// giving the new server's messages ids the broker holds for the old
// server's 7 and 8.
func TestUnitStreamCarryMismatchAfterAnAckNumbersFreshly(t *testing.T) {
	ctx := context.Background()
	u := startCarryTerm(t, 8)
	row := func(id uint64, mid uint64) *outbox.Record {
		return &outbox.Record{ID: id, PartitionKey: "a", MessageID: carryMID(0, mid), RoutingKey: "rk"}
	}
	if err := u.h.Row(ctx, row(1, 6)); err != nil {
		t.Fatal(err)
	}
	pos := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-101"}
	if err := u.h.Commit(ctx, pos, 1); err != nil {
		t.Fatal(err)
	}
	<-u.sinks[0].sent
	u.sinks[0].resolve(t, 1, publish.Confirmed, "")
	if err := u.p.flushAck(ctx, true); err != nil {
		t.Fatal(err)
	}
	u.store.mu.Lock()
	a := u.store.acks[len(u.store.acks)-1]
	u.store.mu.Unlock()
	if a.StreamIDs == nil || a.StreamIDs.Server != "" || a.StreamIDs.IDs[0] != 6 {
		t.Fatalf("the ack stored %+v, want id 6 without a server", a.StreamIDs)
	}
	// The new server lacks message 7: the check ends the term.
	if err := u.h.Row(ctx, row(2, 8)); err == nil {
		t.Fatal("message 8 got id 7")
	}
	u.store.mu.Lock()
	u.store.progress.Position = pos
	u.store.progress.StreamIDs = a.StreamIDs
	u.store.mu.Unlock()
	nextTerm(t, u)
	if got := give(t, u, 8, 300); got[0] <= 8 || got[1] <= 8 {
		t.Fatalf("the next term gives %v: want ids above the broker's 8", got)
	}
}

// A plain continuation of ids stored on the term's own server has two
// cheap guards (continuationDoubt), which turn ids wrongly stored with a
// server (as the carry term stored them before F1 was fixed) into fresh
// numbering, duplicates instead of loss:
//   - the broker's last id is in a higher epoch band than the stored one;
//   - this process issued ids above the stored ones that its record of the
//     server's binlog does not hold.
//
// Ids consistent with both continue.
func TestUnitStreamContinuationGuards(t *testing.T) {
	pos := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-100"}
	storeIDs := func(u *unitPipeline, id uint64) {
		u.store.mu.Lock()
		u.store.progress.Position = pos
		u.store.progress.StreamIDs = &checkpoint.StreamIDs{Stream: "s", Partitions: 1, IDs: []uint64{id}, Server: "server_id:2", At: pos.String()}
		u.store.mu.Unlock()
	}
	setup := func(t *testing.T) *unitPipeline {
		u := startUnitPipeline(t, func(cfg *Config) {
			cfg.RelayName = "r"
			cfg.Stream = streams.Config{Stream: "s", Partitions: 1, Producer: "r"}
		})
		setServer(u, "server_id:2", 2)
		u.p.r.streamIssued = streams.NewIssued()
		return u
	}
	check := func(t *testing.T, u *unitPipeline, wantCont bool, want uint64) {
		t.Helper()
		clears := len(u.store.clears)
		nextTerm(t, u)
		cleared := len(u.store.clears) > clears
		if u.p.streamCont != wantCont || cleared == wantCont {
			t.Fatalf("continues %v, cleared %v: want continues %v", u.p.streamCont, cleared, wantCont)
		}
		if got := give(t, u, 1000); got[0] != want {
			t.Fatalf("next id %d, want %d", got[0], want)
		}
	}
	base := func(u *unitPipeline) uint64 { return streams.EpochBase(u.lease.Epoch()) }

	t.Run("consistent", func(t *testing.T) {
		u := setup(t)
		// A restart on the same server in this process: the record
		// covers what was issued above the stored ids.
		u.p.r.streamSent.reset("server_id:2", []uint64{6})
		for id := uint64(7); id <= 9; id++ {
			u.p.r.streamSent.add(0, id, carryMID(0, id))
			u.p.r.streamIssued.Note("r-0", id)
		}
		storeIDs(u, 6)
		setBrokerLast(u, 9)
		check(t, u, true, 7)
	})
	t.Run("broker in a higher epoch band", func(t *testing.T) {
		u := setup(t)
		storeIDs(u, 6)
		setBrokerLast(u, base(u)+2)
		check(t, u, false, base(u)+3)
	})
	t.Run("a fresh term's counter, the epoch's base - 1", func(t *testing.T) {
		// A fresh term's partition acknowledged before its first
		// message: its next id, the base, is in the broker's band.
		u := setup(t)
		storeIDs(u, base(u)-1)
		setBrokerLast(u, base(u)+2)
		check(t, u, true, base(u))
	})
	t.Run("broker in a lower epoch band", func(t *testing.T) {
		// A stored id of this epoch, the broker's last of an older
		// one: nothing above the stored id there, continue.
		u := setup(t)
		storeIDs(u, base(u)+6)
		setBrokerLast(u, 9)
		check(t, u, true, base(u)+7)
	})
	t.Run("issued ids the record does not hold", func(t *testing.T) {
		u := setup(t)
		// The record of server 2 holds id 7 only; this process issued
		// up to 9 (on another server, or past a carry's jump).
		u.p.r.streamSent.reset("server_id:2", []uint64{6})
		u.p.r.streamSent.add(0, 7, carryMID(0, 7))
		u.p.r.streamIssued.Note("r-0", 9)
		storeIDs(u, 6)
		setBrokerLast(u, 9)
		check(t, u, false, base(u))
	})
}
