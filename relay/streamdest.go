package relay

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/poller"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// The stream destination in binlog mode (docs/operations.md, "The stream
// destination"): one lane per partition stream, each publishing through
// the partition's named producer, and the publishing ids assigned by the
// reader in binlog order, so that they are a function of the binlog:
//
//   - p.ids[i] is the id of the last message of partition i handed to its
//     lane; dispatch gives the next message of i the id p.ids[i]+1;
//   - at each transaction's end the reader snapshots p.ids into the
//     tracker's position (mark), so the acknowledgement that stores a
//     position stores, in the same fenced statement, the ids as of that
//     position and the server they were read on (checkpoint.StreamIDs);
//   - a term continues the stored ids only when they are the deterministic
//     continuation (decideStreamIDs): it resumes from exactly the stored
//     position, on the server they were stored on, for the same stream and
//     partition count. The tail after the position is then the same rows
//     in the same order, routed to the same partitions, so every message
//     gets the id it had, and the broker drops those it stored. The one
//     term on another server that continues them is a carry term after a
//     failover this process went through (streamcarry.go): it checks each
//     id this process issued above them against the message it gave it,
//     and goes on fresh past them. Its ids are then no linear continuation
//     of the stored ones: it clears them before it publishes, and stores
//     its own without a server (never continued) until every partition
//     jumped to fresh ids;
//   - any other term (first start, handover from poll mode, an accepted
//     lossy failover, a position set by `checkpoint set` or written without
//     ids, another partition count, another server) first clears the
//     stored ids in the fenced progress row, so no later term continues
//     ids this one pushed the producers past, and numbers freshly: from
//     streams.FreshAfter of the broker's last id, the highest id this
//     process issued under the name and the epoch's base (epoch<<40), so
//     no older publisher's in-flight message (a frozen leader of an older
//     epoch, an undrained publisher of this process) shares an id with a
//     new one: at least once, never a message dropped as a false
//     duplicate.
//
// A producer that fails (a message not confirmed, the connection lost) ends
// the term: the next term restarts from the stored position with the
// stored ids. One message is never retried alone: an id below one the
// broker stored would be dropped.

// mark is the tracker's position: the binlog position after a transaction
// and, with the stream destination, the publishing ids as of it (a
// snapshot shared by the transactions that did not change it; never
// modified); handover: the position is inside the handover window, whose
// rows were published only if still pending, so a term resuming from it
// would not repeat the same messages; unmarked: a carry term's position
// before every partition's ids jumped (streamcarry.go), whose ids are
// stored without a server.
type mark struct {
	position.Position
	ids      []uint64
	handover bool
	unmarked bool
}

// streamIDsAt is what an acknowledgement stores with a position: the ids of
// m and the term's server, or nil without the stream destination or inside
// the handover window. The ids of an unmarked mark are stored without a
// server: no term continues them (decideStreamIDs).
func (p *pipeline) streamIDsAt(m mark) *checkpoint.StreamIDs {
	if !p.r.cfg.Stream.Enabled() || m.ids == nil || m.handover {
		return nil
	}
	server := p.streamServer
	if m.unmarked {
		server = ""
	}
	return &checkpoint.StreamIDs{Stream: p.r.cfg.Stream.Stream, Partitions: p.r.cfg.Stream.Partitions, IDs: m.ids,
		Server: server, At: m.Position.String()}
}

// ackMode is the mode an acknowledgement stores with position m: poll for a
// position inside the handover window (the next term then hands over
// again), else the term's current mode.
func (p *pipeline) ackMode(m mark) Mode {
	if m.handover {
		return ModePoll
	}
	return p.mode.Load().(Mode)
}

// streamLane is the partition of rec, with the stream destination.
func (p *pipeline) streamLane(rec *outbox.Record) int {
	return streams.Partition(rec.PartitionKey, rec.MessageID.String(), p.r.cfg.Stream.Partitions)
}

// nextID gives the next message of partition i, mid, its publishing id
// (reader goroutine only), and records it (sentIDs). A carry term checks
// mid against the message this process gave the id on the old server: an
// error means the id must not be given (the term ends).
func (p *pipeline) nextID(i int, mid outbox.MessageID) (uint64, error) {
	id := p.ids[i] + 1
	counter := id
	if p.carry != nil {
		var err error
		if id, counter, err = p.carry.next(i, p.ids[i], mid); err != nil {
			return 0, err
		}
	}
	p.ids[i] = counter
	p.idsDirty = true
	p.r.streamSent.add(i, id, mid)
	return id, nil
}

// markAt is the tracker's position for a transaction ending at pos (reader
// goroutine only); handover: pos is inside the handover window.
func (p *pipeline) markAt(pos position.Position, handover bool) mark {
	if p.ids == nil {
		return mark{Position: pos, handover: handover}
	}
	if p.idsDirty || p.idsSnap == nil {
		p.idsSnap = slices.Clone(p.ids)
		p.idsDirty = false
	}
	// A carry term's ids are a linear continuation of what the broker
	// holds for each producer only once every partition jumped
	// (streamcarry.go): until then they are stored without a server.
	unmarked := p.carry != nil && p.carry.pending > 0
	return mark{Position: pos, ids: p.idsSnap, handover: handover, unmarked: unmarked}
}

// streamIDBroker is the broker's query of the producers' last publishing
// ids (*streamPub).
type streamIDBroker interface {
	LastIDs(ctx context.Context, prefix string) ([]uint64, error)
}

// decideStreamIDs decides, before the term publishes anything, whether its
// lanes continue the stored ids (see above): resume is that the term tails
// from exactly the stored position. A term that does not continue them
// clears them in the progress row (fenced by its epoch) first.
func (p *pipeline) decideStreamIDs(ctx context.Context, progress checkpoint.Progress, resume bool) error {
	cfg := p.r.cfg.Stream
	if !cfg.Enabled() {
		return nil
	}
	srv, err := p.r.serverIdentity(ctx)
	if err != nil {
		return err
	}
	server, dumpID := srv.Identity, srv.ID
	// The identity was read over a pooled connection, which may still
	// reach the server the address pointed at before a failover. When the
	// last term's binlog dump was on another server than that, the
	// identity is not the binlog's: this term neither continues the stored
	// ids nor marks its own with a server (so no term continues them), and
	// its dumps must be on the server the last one was on.
	if saw := p.r.streamDumpSaw.Swap(0); saw != 0 && saw != srv.ID {
		p.r.log.Warn("stream destination: the last binlog dump was on another server than the one the database pool reads; numbering freshly, the ids stored unmarked",
			zap.Uint32("dump_server_id", saw), zap.Uint32("pool_server_id", srv.ID), zap.String("pool_server", srv.Identity))
		server, dumpID = "", saw
	}
	p.streamServer = server
	p.r.streamServer.Store(server)
	p.r.streamDumpID.Store(dumpID)
	st := progress.StreamIDs
	p.streamCarry = false
	ours := resume && st != nil && st.Stream == cfg.Stream && st.Partitions == cfg.Partitions &&
		len(st.IDs) == cfg.Partitions && st.Server != "" &&
		st.At == storedPosition(progress).String() // not moved by a binary that leaves stream_ids as they are
	p.streamCont = ours && st.Server == server
	if p.streamCont {
		return nil
	}
	if ours && server != "" {
		// Another server: carried on only where that is provably the
		// continuation (streamcarry.go); the broker's ids and this
		// process's record are checked in startIDs.
		why, err := p.carryPrecheck(ctx, progress, st, srv)
		if err != nil {
			return err
		}
		if why == "" {
			p.streamCont, p.streamCarry = true, true
			return nil
		}
		p.r.log.Info("stream destination: the stored publishing ids were read on another server and are not carried over",
			zap.String("stored_server", st.Server), zap.String("server", server), zap.String("because", why))
	}
	if st != nil {
		p.r.log.Info("stream destination: the stored publishing ids do not continue this term; clearing them",
			zap.Bool("resume", resume), zap.String("stored_server", st.Server), zap.String("server", server),
			zap.Int("stored_partitions", st.Partitions), zap.String("stored_stream", st.Stream),
			zap.String("stored_at", st.At))
	}
	return p.store.ClearStreamIDs(ctx, p.epoch)
}

// startIDs sets the ids the term's lanes continue from, before the tail
// publishes (after the sweep): the stored ones when decideStreamIDs found
// them the continuation and nothing here contradicts that, else fresh ids
// above what the sweep sent. A resuming term (the only kind that continues
// or carries the stored ids) does not sweep: nothing of it has published
// yet, so clearing the stored ids here is still before anything publishes.
func (p *pipeline) startIDs(ctx context.Context, progress checkpoint.Progress) error {
	sp, ok := p.pub.(streamIDBroker)
	if !ok || !p.r.cfg.Stream.Enabled() {
		return nil
	}
	cfg := p.r.cfg.Stream
	broker, err := sp.LastIDs(ctx, cfg.Producer)
	if err != nil {
		return err
	}
	p.carry = nil
	p.idsSnap, p.idsDirty = nil, false
	if p.streamCarry {
		// Whether or not the ids are carried, this term's ids are not
		// a linear continuation of the stored ones: a carry term jumps
		// to fresh ids past the checked ones, so a later term (on the
		// old server after a fail-back, say) that continued the stored
		// ids would give new messages ids below the fresh ones the
		// broker holds, and the broker would drop them. Cleared,
		// fenced by the epoch, before anything of the term publishes;
		// the carry term's own acknowledgements store its ids without
		// a server until every partition jumped (markAt).
		if err := p.store.ClearStreamIDs(ctx, p.epoch); err != nil {
			return err
		}
		c, why := p.startCarry(progress.StreamIDs, broker)
		if c == nil {
			p.r.log.Info("stream destination: the stored publishing ids were read on another server and are not carried over",
				zap.String("stored_server", progress.StreamIDs.Server), zap.String("server", p.streamServer), zap.String("because", why))
			p.streamCont, p.streamCarry = false, false
		} else {
			p.carry = c
			p.logCarry(c, broker)
		}
	}
	if p.streamCont && p.carry == nil {
		if why := p.continuationDoubt(progress.StreamIDs.IDs, broker); why != "" {
			p.r.log.Warn("stream destination: the stored publishing ids are not continued; clearing them",
				zap.String("because", why), zap.Uint64s("ids", progress.StreamIDs.IDs), zap.Uint64s("broker_last", broker))
			p.streamCont = false
			if err := p.store.ClearStreamIDs(ctx, p.epoch); err != nil {
				return err
			}
		}
	}
	if p.streamCont {
		p.ids = slices.Clone(progress.StreamIDs.IDs)
		if p.carry != nil {
			// A partition with nothing to check jumps at once, so
			// that an idle partition does not keep the term's ids
			// unmarked.
			p.carry.jumpIdle(p.ids)
		}
		// The record of what each id was given goes on when it is of
		// this server (a restart on it); a carry term's record starts
		// at the stored ids (fresh ones where a partition jumped),
		// which it checks up to the issued ones.
		if p.carry != nil || !p.r.streamSent.keep(p.streamServer, len(p.ids)) {
			p.r.streamSent.reset(p.streamServer, p.ids)
		}
		if p.carry != nil {
			return nil
		}
		// What the broker holds above the stored ids is the tail the last
		// term published and did not acknowledge: this term publishes it
		// again with the same ids, and the broker drops it.
		var repeats uint64
		for i, b := range broker {
			if b > p.ids[i] {
				repeats += b - p.ids[i]
			}
		}
		p.r.log.Info("stream destination: continuing the stored publishing ids (exactly once); the broker drops the repeated tail",
			zap.Uint64s("ids", p.ids), zap.Uint64s("broker_last", broker), zap.Uint64("repeats", repeats))
		return nil
	}
	ids := make([]uint64, len(broker))
	for i, b := range broker {
		ids[i] = streams.FreshAfter(b, p.r.streamIssued.Last(cfg.ProducerName(i)), p.epoch)
	}
	p.ids = ids
	p.r.streamSent.reset(p.streamServer, p.ids)
	p.r.log.Info("stream destination: numbering freshly above the broker's last ids and the epoch's base (at least once until the next stored position)",
		zap.Uint64s("ids", p.ids), zap.Uint64s("broker_last", broker), zap.Int64("epoch", p.epoch))
	return nil
}

// continuationDoubt is why a plain continuation of the stored ids on their
// own server (decideStreamIDs) must not go on, "" when nothing contradicts
// it. Both checks are cheap guards that turn a wrong continuation (a bug
// that stored ids which are not the broker's sequence) into duplicates
// instead of dropped messages:
//
//   - the broker's last id of a producer is in a higher epoch band
//     (id>>streams.EpochBits) than the id the continuation gives next (the
//     stored one + 1; a fresh term's counter is the epoch's base - 1, so
//     its next id is in the epoch's band): a later term numbered freshly
//     above the stored ids, so continuing them would give new messages
//     ids the broker drops;
//   - this process issued ids above the stored ones that its record of
//     this server's binlog does not hold (they were given on another
//     server, or by a carry term past its jump): the broker may hold them
//     for messages this term's binlog does not give them to.
func (p *pipeline) continuationDoubt(stored, broker []uint64) string {
	cfg := p.r.cfg.Stream
	upTo := make([]uint64, len(stored))
	for i, id := range stored {
		if i < len(broker) && broker[i]>>streams.EpochBits > (id+1)>>streams.EpochBits {
			return fmt.Sprintf("the broker's last id of partition %d (%d) is in a higher epoch band than the stored one (%d) continues with", i, broker[i], id)
		}
		upTo[i] = max(id, p.r.streamIssued.Last(cfg.ProducerName(i)))
	}
	if !slices.Equal(upTo, stored) {
		if _, ok := p.r.streamSent.span(p.streamServer, stored, upTo); !ok {
			return "this process issued ids above the stored ones that its record of this server's binlog does not hold"
		}
	}
	return ""
}

// fail ends the term with err (a failed stream producer): reading stops,
// and the run returns err, so the term restarts from the stored position.
func (p *pipeline) fail(err error) {
	p.failMu.Lock()
	if p.failErr == nil {
		p.failErr = err
	}
	p.failMu.Unlock()
	p.cancelRead()
}

// failure is the error fail recorded, nil when none.
func (p *pipeline) failure() error {
	p.failMu.Lock()
	defer p.failMu.Unlock()
	return p.failErr
}

// watchSinks ends the term when a lane's producer fails, whether or not the
// lane is publishing at the time.
func (p *pipeline) watchSinks(g *group) {
	for _, ch := range p.channels {
		fs, ok := ch.(interface {
			Failed() <-chan struct{}
			Err() error
		})
		if !ok {
			continue
		}
		stop := make(chan struct{})
		g.Go("sink-watch", func() { close(stop) }, func() error {
			select {
			case <-fs.Failed():
				p.fail(fs.Err())
			case <-stop:
			}
			return nil
		})
	}
}

// streamPub is a term's publisher with the stream destination: the stream
// connection and its producers, "<relay-name>-<i>" for the lanes, the
// sweep before tailing and poll mode (never at once), and
// "<relay-name>-<i>-delayed" for the due-time sweep, which runs beside the
// lanes and must not share their sequence (a name ending in a letter is
// never "<some relay name>-<i>").
type streamPub struct {
	r      *Relay
	pub    *streams.Publisher
	leader lease
	next   int // the partition of the next lane NewSink opens
	// ctx is the term's, given to openStreamPub: it bounds NewSink's
	// broker calls (the seam has no context of its own).
	ctx context.Context
}

// openTimeout bounds opening a lane's producer within the term's context.
const openTimeout = 30 * time.Second

// delayedSuffix names the due-time sweep's producers.
const delayedSuffix = "-delayed"

// openStreamPub is binlog mode's openBinlog with the stream destination.
func (r *Relay) openStreamPub(ctx context.Context, leader lease) (binlogPublisher, error) {
	pub, err := streams.DialTerm(r.cfg.Stream, r.streamIssued, leader.Epoch())
	if err != nil {
		return nil, err
	}
	r.state.setPublisher(pub)
	return &streamPub{r: r, pub: pub, leader: leader, ctx: ctx}, nil
}

// LastIDs is the broker's last publishing id of each producer
// "<prefix>-<i>".
func (s *streamPub) LastIDs(ctx context.Context, prefix string) ([]uint64, error) {
	return s.pub.LastIDs(ctx, prefix)
}

// Connected: the stream client reconnects nothing; a lost connection fails
// the producers, which ends the term.
func (s *streamPub) Connected() (bool, <-chan struct{}) { return true, nil }

// NewSink opens the lane of the next partition (the lanes are opened in
// partition order).
func (s *streamPub) NewSink(onResult func(publish.Result)) (sink, error) {
	ctx, cancel := context.WithTimeout(s.ctx, openTimeout)
	defer cancel()
	pr, err := s.pub.Producer(ctx, s.r.cfg.Stream.Producer, s.next)
	if err != nil {
		return nil, err
	}
	s.next++
	return streams.NewLane(pr, onResult), nil
}

// Drainer delivers the rows pending before tailing into the streams, at
// least once: through the lanes' producers, numbered above the broker's
// last ids (the lanes then start above what it sent: startIDs).
func (s *streamPub) Drainer() (drainer, error) {
	return s.r.newPoller(routerPub{s.pub, s.r.cfg.Stream.Producer, ""}, s.leader)
}

// DelayedSweeper delivers due delayed rows into the streams through
// producers of their own, numbered above the broker's last ids for them
// (opened at the first delayed row).
func (s *streamPub) DelayedSweeper() (delayedSweeper, time.Duration, error) {
	pl, err := s.r.newPoller(routerPub{s.pub, s.r.cfg.Stream.Producer, delayedSuffix}, s.leader)
	if err != nil {
		return nil, 0, err
	}
	sw, err := pl.NewDelayedSweeper()
	if err != nil {
		return nil, 0, err
	}
	return sw, pl.Config().Interval, nil
}

func (s *streamPub) Close() error { return s.pub.Close() }

// routerPub is the stream destination as the poller's publisher: each
// worker gets a router over the producers "<prefix>-<i><suffix>".
type routerPub struct {
	pub            *streams.Publisher
	prefix, suffix string
}

func (r routerPub) NewChannel(onResult func(publish.Result)) (poller.Channel, error) {
	return r.pub.NewRouter(r.prefix, r.suffix, onResult), nil
}

// laneCount is the number of publishing lanes: one per partition stream
// with the stream destination, Config.Lanes otherwise.
func (r *Relay) laneCount() int {
	if r.cfg.Stream.Enabled() {
		return r.cfg.Stream.Partitions
	}
	return r.cfg.Lanes
}

// openStreamPolling is poll mode's openPoll with the stream destination:
// the poller publishes through the producers "<relay-name>-<i>", numbered
// above the broker's last ids (at least once; streams.Router).
func (r *Relay) openStreamPolling(ctx context.Context, leader lease) (pollPublisher, rounds, error) {
	// The poll term's ids do not continue the stored ones: cleared before
	// it publishes, so no later term continues them (decideStreamIDs).
	if err := r.progress.ClearStreamIDs(ctx, leader.Epoch()); err != nil {
		return nil, nil, err
	}
	pub, err := streams.DialTerm(r.cfg.Stream, r.streamIssued, leader.Epoch())
	if err != nil {
		return nil, nil, err
	}
	r.state.setPublisher(pub)
	sp := &streamPub{r: r, pub: pub, leader: leader, ctx: ctx}
	p, err := r.newPoller(routerPub{pub, r.cfg.Stream.Producer, ""}, leader)
	if err != nil {
		pub.Close()
		return nil, nil, err
	}
	return sp, p, nil
}

// serverIdent is a database server's identity: Identity is "uuid:" and its
// @@server_uuid (MySQL), or "server_id:" and its @@server_id where there
// is no uuid (MariaDB; servers of one replication topology have distinct
// server ids); ID is its @@server_id, which the header of every event it
// sends in a binlog dump carries (0: unknown).
type serverIdent struct {
	Identity string
	ID       uint32
	// StrictGTID: the server runs gtid_strict_mode (MariaDB; false
	// where there is none), read over the same connection.
	StrictGTID bool
}

// serverIdentity is the identity of the server behind db, both read over
// one connection.
func serverIdentity(ctx context.Context, db *sql.DB) (serverIdent, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return serverIdent{}, fmt.Errorf("read the database server's identity: %w", err)
	}
	defer conn.Close()
	var id uint64
	if err := conn.QueryRowContext(ctx, "SELECT @@server_id").Scan(&id); err != nil {
		return serverIdent{}, fmt.Errorf("read the database server's identity (@@server_id): %w", err)
	}
	srv := serverIdent{Identity: "server_id:" + strconv.FormatUint(id, 10), ID: uint32(id)}
	var uuid sql.NullString
	if err := conn.QueryRowContext(ctx, "SELECT @@server_uuid").Scan(&uuid); err == nil && uuid.String != "" {
		// MySQL: it has no gtid_strict_mode (not asked: the failed
		// query would only fill its error log), and StrictGTID is
		// false.
		srv.Identity = "uuid:" + uuid.String
		return srv, nil
	} else if ctx.Err() != nil {
		return serverIdent{}, fmt.Errorf("read the database server's identity (@@server_uuid): %w", ctx.Err())
	}
	var strict sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT @@gtid_strict_mode").Scan(&strict); err == nil {
		srv.StrictGTID = strict.Int64 == 1
	} else if ctx.Err() != nil {
		return serverIdent{}, fmt.Errorf("read the database server's identity (@@gtid_strict_mode): %w", ctx.Err())
	}
	return srv, nil
}

// checkStreamServer is part of the tailer's CheckServer with the stream
// destination: a reconnected binlog stream that reached another server
// than the term's (a VIP moved) ends the term, so that the ids the next
// term stores are marked with the server they were read on, and the next
// term numbers freshly (decideStreamIDs).
func (r *Relay) checkStreamServer(ctx context.Context) error {
	want, _ := r.streamServer.Load().(string)
	if !r.cfg.Stream.Enabled() || want == "" {
		return nil
	}
	srv, err := r.serverIdentity(ctx)
	if err != nil {
		return err // retried with the connection
	}
	if got := srv.Identity; got != want {
		return &canal.StopError{Err: fmt.Errorf("the binlog stream reconnected to another server (%s; the term started on %s): "+
			"restarting the term, whose stream publishing ids then start fresh", got, want)}
	}
	return nil
}

// checkDumpServer is the tailer's CheckDumpServer with the stream
// destination: serverID is the server_id in the header of the first event
// of a binlog dump (the server's artificial ROTATE), the first dump of the
// term included, before any row of it is published. A dump on another
// server than the one whose identity decided the term's ids (read over a
// pooled connection: the address may have moved in between, or the pool
// may hold a connection to the old server) ends the term: continuing the
// stored ids on another server's binlog, whose order may differ, would
// make the broker drop messages as duplicates. The next term decides
// again, knowing which server the dump was on.
func (r *Relay) checkDumpServer(serverID uint32) error {
	want := r.streamDumpID.Load()
	if !r.cfg.Stream.Enabled() || want == 0 || serverID == want {
		return nil
	}
	r.streamDumpSaw.Store(serverID)
	return &canal.StopError{Err: fmt.Errorf("the binlog dump is on the server with server_id %d, but the term's stream publishing ids were decided for server_id %d "+
		"(the address moved, or the database pool reached the old server): restarting the term, whose ids then start fresh", serverID, want)}
}
