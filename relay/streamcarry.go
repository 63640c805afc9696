package relay

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/streams"
)

// Carrying the stored stream publishing ids across a primary failover
// (docs/operations.md, "Exactly once, and where it is at least once").
//
// The ids of a term that resumes from the stored checkpoint are a function
// of the binlog after it; another server's binlog may hold the same
// transactions in another order, so a term on another server than the one
// the ids were stored on numbers freshly (at least once). A failover to a
// caught-up replica behind the same address is the common case where the
// order is the same. A term on a server other than the stored ids' server
// carries them on (a "carry term") when ALL of these hold:
//
//  1. this process read the stored ids' server itself: its record of the
//     message each id was given (sentIDs) is of that server, and covers,
//     for every partition i, every id above the stored one up to the
//     highest this process issued to the producer (streams.Issued); the
//     term's lossy-failover check passed (the server's GTID state contains
//     everything this process published: it resumes, it did not accept
//     lost GTIDs), and Config.AcceptLostGTIDs is off;
//  2. the stored position has GTIDs of one MariaDB domain, the server's
//     @@gtid_binlog_state has no other domain and it runs
//     gtid_strict_mode: its binlog after the position then holds the
//     transactions in the order they were replicated, which is the old
//     primary's (MySQL, or several domains: fresh);
//  3. for every partition, the broker's last id (query_publisher_sequence)
//     is not above the highest id this process issued to the producer:
//     no other process (a frozen leader of an older epoch, say) stored
//     ids this one does not know the messages of;
//  4. the same --stream and --stream-partitions, and the stored position
//     is still the one the ids were stored with (as for any continuation).
//
// Those make the carry the likely-exact continuation; what makes it sound
// is checked message by message while the term reads. The only ids the
// broker can hold above the stored ones are at most the ones this process
// issued (3), and the record says which message each of those was. The
// carry term gives a message the carried id k only while k is one of them
// and the message is the one the record holds for k: a message that
// differs (a transaction missing from the new server, skipped by an
// operator, or ordered otherwise) ends the term before it is handed to a
// lane. Past the last issued id, the partition's ids jump to fresh ones
// (streams.FreshAfter of the broker's last id, this process's issued ids
// and the epoch's base), so that an id no one verified is never one a
// publisher of an older epoch may still send for a transaction of the old
// primary; a partition with no id to check jumps at the term's start.
//
// After the jump the term's ids are no linear continuation of the stored
// ones, and a term continuing either from the wrong point would give new
// messages ids below the fresh ones the broker holds (dropped). So the
// carry term clears the stored ids before it publishes (a fail-back to the
// old server numbers freshly), and its acknowledgements store its ids
// without a server (never continued: its successor numbers freshly, also
// after a message that differs) until, at the acknowledged position, every
// partition jumped (carry.pending is 0). From then on each stored id is
// one of the fresh ids, and those after it were given one by one in the
// new server's binlog order, as a fresh term gives them: stored with the
// server, they are continued as a fresh term's are. Every id the broker drops as a duplicate is then the same
// message, and every message the broker stores under a fresh id was never
// given an id by this process: exactly once, except that a frozen leader
// of an older epoch that wakes after the failover may publish, under its
// own ids, messages the carry term publishes again under fresh ones (at
// least once, as with fresh ids).

// sentIDs is the message each publishing id was given by this process's
// binlog terms on one server, above the stored ids: for each partition, the
// ids first, first+1, … and their message ids. The reader adds each id it
// gives (add); an acknowledgement that stores ids drops those at or below
// them (trim). Safe for concurrent use.
type sentIDs struct {
	mu     sync.Mutex
	server string // the identity of the server whose binlog gave the ids ("": none)
	parts  []sentPart
	// keepFor is how long ids stay recorded after an acknowledgement
	// stored them (sentKeep; 0 in unit tests): a promoted replica's copy
	// of the progress row may lag the old primary's by its last
	// acknowledgements, and a carry term resumes from the replica's.
	keepFor time.Duration
	stores  []storedAt // the stored ids not yet applied by trim, oldest first
}

// sentKeep is sentIDs.keepFor: a replica whose copy of the progress row
// lags by up to this much still gets its ids carried over.
const sentKeep = 10 * time.Second

type storedAt struct {
	at  time.Time
	ids []uint64
}

type sentPart struct {
	first uint64 // the id of mids[head]
	head  int    // mids[:head] are trimmed
	mids  []outbox.MessageID
}

func (p *sentPart) end() uint64 { return p.first + uint64(len(p.mids)-p.head) } // the id after the last

// reset starts the record over for server: partition i's next id is
// ids[i]+1.
func (s *sentIDs) reset(server string, ids []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.server = server
	s.stores = nil
	s.parts = make([]sentPart, len(ids))
	for i, id := range ids {
		s.parts[i].first = id + 1
	}
}

// keep is whether a term continuing ids on server (from the same stored
// ids) keeps the record: it is of that server and of the same partitions.
// add checks every id the term gives again against it.
func (s *sentIDs) keep(server string, partitions int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return server != "" && s.server == server && len(s.parts) == partitions
}

// add records that partition i's id was given to mid. An id already
// recorded for another message, or one that leaves a gap, starts the
// partition's record over at id: what it held is no longer vouched for. A
// term without a server (its ids stored unmarked, never carried, and so
// never trimmed) records nothing.
func (s *sentIDs) add(i int, id uint64, mid outbox.MessageID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.server == "" || i >= len(s.parts) {
		return
	}
	p := &s.parts[i]
	switch {
	case id == p.end():
		p.mids = append(p.mids, mid)
	case id >= p.first && id < p.end() && p.mids[p.head+int(id-p.first)] == mid:
	default:
		p.first, p.head, p.mids = id, 0, append(p.mids[:0], mid)
	}
}

// trim drops, keepFor after an acknowledgement stored ids (with a
// checkpoint of the record's server), the ids at or below them: no term
// carries them again once every copy of the progress row has them.
func (s *sentIDs) trim(server string, ids []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if server == "" || server != s.server || len(ids) != len(s.parts) {
		return
	}
	now := time.Now()
	if n := len(s.stores); n > 0 && now.Sub(s.stores[n-1].at) < s.keepFor/100 {
		s.stores[n-1].ids = ids // at most 100 pending; the newer ids are kept for slightly less
	} else {
		s.stores = append(s.stores, storedAt{at: now, ids: ids})
	}
	var due []uint64
	k := 0
	for k < len(s.stores) && now.Sub(s.stores[k].at) >= s.keepFor {
		due = s.stores[k].ids
		k++
	}
	s.stores = append(s.stores[:0], s.stores[k:]...)
	if due != nil {
		s.dropLocked(due)
	}
}

// dropLocked drops the ids at or below ids[i].
func (s *sentIDs) dropLocked(ids []uint64) {
	for i, id := range ids {
		p := &s.parts[i]
		if id < p.first {
			continue
		}
		n := min(int(id-p.first)+1, len(p.mids)-p.head)
		p.head += n
		p.first += uint64(n)
		if p.head > 1024 && p.head > len(p.mids)/2 {
			p.mids = append(p.mids[:0], p.mids[p.head:]...)
			p.head = 0
		}
	}
}

// span returns, when the record is of server and covers every id in
// (from[i], upTo[i]] of every partition, a copy of their message ids.
func (s *sentIDs) span(server string, from, upTo []uint64) ([][]outbox.MessageID, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if server == "" || server != s.server || len(s.parts) != len(from) || len(from) != len(upTo) {
		return nil, false
	}
	out := make([][]outbox.MessageID, len(from))
	for i := range from {
		if upTo[i] <= from[i] {
			continue
		}
		p := &s.parts[i]
		if from[i]+1 < p.first || upTo[i] >= p.end() {
			return nil, false
		}
		lo := p.head + int(from[i]+1-p.first)
		out[i] = append([]outbox.MessageID(nil), p.mids[lo:lo+int(upTo[i]-from[i])]...)
	}
	return out, true
}

// carry is a carry term's check of the ids it gives (see above): for
// partition i, the ids up to upTo[i] must go to the messages mids[i] (the
// first is stored[i]+1's); past upTo[i], the ids jump to after fresh[i].
// pending is the number of partitions that have not jumped yet: while it
// is not 0 the term's acknowledgements store its ids without a server
// (markAt), so no term continues them.
type carry struct {
	stored, upTo, fresh []uint64
	mids                [][]outbox.MessageID
	jumped              []bool
	pending             int
	from                string // the stored ids' server
}

// jumpIdle jumps, at the term's start, every partition with nothing to
// check (upTo[i] is the stored id): ids[i] becomes the id its next message
// would get less one, as next would give it (ids are the term's counters,
// the stored ids).
func (c *carry) jumpIdle(ids []uint64) {
	for i := range ids {
		if !c.jumped[i] && c.upTo[i] <= ids[i] {
			c.jumped[i] = true
			c.pending--
			ids[i] = max(ids[i], c.fresh[i])
		}
	}
}

// next is the id the carry term gives the next message of partition i, mid
// (last is the counter p.ids[i], not yet moved), and the counter's new
// value; an error when mid is not the message this process gave that id.
// The partition jumps with its last checked id: the id is that one, the
// counter the fresh base, so that the id stored with the transaction's
// position is already past the jump (the next message gets fresh[i]+1, as
// the successor resuming from there gives it) and a partition that goes
// quiet after its checked tail does not keep the term's ids unmarked.
func (c *carry) next(i int, last uint64, mid outbox.MessageID) (id, counter uint64, err error) {
	id = last + 1
	if c.jumped[i] {
		return id, id, nil
	}
	if id > c.upTo[i] {
		// Not reached: a partition jumps at its last checked id, or at
		// the term's start with none (jumpIdle).
		c.jumped[i] = true
		c.pending--
		id = max(id, c.fresh[i]+1)
		return id, id, nil
	}
	if want := c.mids[i][id-c.stored[i]-1]; want != mid {
		return 0, 0, fmt.Errorf("stream destination: partition %d's publishing id %d was given to message %s on server %s, "+
			"but the new server's binlog gives it to message %s: ending the term, the next one numbers freshly", i, id, want, c.from, mid)
	}
	if id < c.upTo[i] {
		return id, id, nil
	}
	c.jumped[i] = true
	c.pending--
	return id, max(id, c.fresh[i]), nil
}

// carryPrecheck is why a term on srv may not carry the stored ids st (read
// on another server) on, "" when conditions 1 (but the record's coverage)
// and 2 above hold; startCarry checks the rest.
func (p *pipeline) carryPrecheck(ctx context.Context, progress checkpoint.Progress, st *checkpoint.StreamIDs, srv serverIdent) (string, error) {
	r := p.r
	if r.cfg.AcceptLostGTIDs {
		return "Config.AcceptLostGTIDs is set", nil
	}
	if !r.streamSent.keep(st.Server, len(st.IDs)) {
		return "this process did not publish from the stored ids' server", nil
	}
	stored := storedPosition(progress)
	if stored.Flavor != position.FlavorMariaDB {
		return "not MariaDB (its gtid_strict_mode keeps one domain's order)", nil
	}
	dom, ok := mariadbDomains(stored.GTIDSet)
	if !ok || len(dom) != 1 {
		return "the stored position has other than one GTID domain", nil
	}
	if !srv.StrictGTID {
		return "the server does not run gtid_strict_mode", nil
	}
	executed, err := r.failover.server.ExecutedGTIDs(ctx, position.FlavorMariaDB)
	if err != nil {
		return "", err
	}
	if sdom, ok := mariadbDomains(executed); !ok || len(sdom) != 1 || sdom[0] != dom[0] {
		return fmt.Sprintf("the server's GTID state %q has other domains than the stored position's", executed), nil
	}
	published, _, err := r.failover.published.newest()
	if err != nil {
		return "", err
	}
	if published.GTIDSet == "" {
		return "this process published nothing", nil
	}
	if missing, err := position.Missing(position.FlavorMariaDB, executed, published); err != nil || missing != "" {
		return fmt.Sprintf("the server lacks published transactions (%s)", missing), err
	}
	return "", nil
}

// startCarry sets up a carry term's check (conditions 1 and 3), after the
// broker's last ids were read; nil when it may not carry the ids (the
// caller then numbers freshly), with the reason.
func (p *pipeline) startCarry(st *checkpoint.StreamIDs, broker []uint64) (*carry, string) {
	cfg := p.r.cfg.Stream
	c := &carry{stored: st.IDs, upTo: make([]uint64, len(broker)), fresh: make([]uint64, len(broker)),
		jumped: make([]bool, len(broker)), pending: len(broker), from: st.Server}
	for i, b := range broker {
		issued := p.r.streamIssued.Last(cfg.ProducerName(i))
		if b > issued {
			return nil, fmt.Sprintf("the broker's last id of partition %d (%d) is above the highest this process issued (%d)", i, b, issued)
		}
		c.upTo[i] = max(issued, st.IDs[i])
		c.fresh[i] = streams.FreshAfter(b, issued, p.epoch)
	}
	mids, ok := p.r.streamSent.span(st.Server, st.IDs, c.upTo)
	if !ok {
		return nil, "this process's record of the ids it issued does not cover those above the stored ones"
	}
	c.mids = mids
	return c, ""
}

// mariadbDomains is the domains of a MariaDB GTID set ("0-1-100,1-2-5"),
// each once, in order; false when it does not parse.
func mariadbDomains(set string) ([]string, bool) {
	var out []string
	for _, g := range strings.Split(set, ",") {
		g = strings.TrimSpace(g)
		if g == "" {
			continue
		}
		d, _, ok := strings.Cut(g, "-")
		if !ok || d == "" {
			return nil, false
		}
		if len(out) == 0 || !containsString(out, d) {
			out = append(out, d)
		}
	}
	return out, true
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// logCarry logs a carry term's start.
func (p *pipeline) logCarry(c *carry, broker []uint64) {
	p.r.log.Info("stream destination: carrying the stored publishing ids over to this server (failover to a caught-up replica); "+
		"each id up to the last this process issued is checked against the message it was given, then the ids go on fresh",
		zap.String("stored_server", c.from), zap.String("server", p.streamServer), zap.Uint64s("ids", c.stored),
		zap.Uint64s("checked_up_to", c.upTo), zap.Uint64s("fresh_after", c.fresh), zap.Uint64s("broker_last", broker))
}
