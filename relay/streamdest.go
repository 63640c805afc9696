package relay

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"

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
//     position (checkpoint.StreamIDs);
//   - a term that resumes exactly from the stored position with ids stored
//     for the same stream and partition count starts from them: the tail
//     after the position is the same rows in the same order, routed to the
//     same partitions, so every message gets the id it had, and the broker
//     drops those it stored;
//   - any other start (first start, handover from poll mode, an accepted
//     lossy failover, a position set by `checkpoint set` or written without
//     ids, another partition count) starts above the broker's last id of
//     each producer: at least once, never a message dropped as a false
//     duplicate.
//
// A producer that fails (a message not confirmed, the connection lost) ends
// the term: the next term restarts from the stored position with the
// stored ids. One message is never retried alone: an id below one the
// broker stored would be dropped.

// mark is the tracker's position: the binlog position after a transaction
// and, with the stream destination, the publishing ids as of it (a
// snapshot shared by the transactions that did not change it; never
// modified).
type mark struct {
	position.Position
	ids []uint64
}

// streamIDsAt is what an acknowledgement stores with a position: the ids of
// m, or nil without the stream destination.
func (r *Relay) streamIDsAt(m mark) *checkpoint.StreamIDs {
	if !r.cfg.Stream.Enabled() || m.ids == nil {
		return nil
	}
	return &checkpoint.StreamIDs{Stream: r.cfg.Stream.Stream, Partitions: r.cfg.Stream.Partitions, IDs: m.ids}
}

// streamLane is the partition of rec, with the stream destination.
func (p *pipeline) streamLane(rec *outbox.Record) int {
	return streams.Partition(rec.PartitionKey, rec.MessageID.String(), p.r.cfg.Stream.Partitions)
}

// nextID gives the next message of partition i its publishing id (reader
// goroutine only).
func (p *pipeline) nextID(i int) uint64 {
	p.ids[i]++
	p.idsDirty = true
	return p.ids[i]
}

// markAt is the tracker's position for a transaction ending at pos (reader
// goroutine only).
func (p *pipeline) markAt(pos position.Position) mark {
	if p.ids == nil {
		return mark{Position: pos}
	}
	if p.idsDirty || p.idsSnap == nil {
		p.idsSnap = slices.Clone(p.ids)
		p.idsDirty = false
	}
	return mark{Position: pos, ids: p.idsSnap}
}

// startIDs sets the ids the term's lanes continue from, before the tail
// publishes: the stored ones when resume (the term tails from exactly the
// stored position) and they are for this stream and partition count;
// otherwise above both the broker's last id of each lane producer and what
// this term's sweep sent through it.
func (p *pipeline) startIDs(progress checkpoint.Progress, resume bool) error {
	sp, ok := p.pub.(*streamPub)
	if !ok {
		return nil
	}
	cfg := p.r.cfg.Stream
	if st := progress.StreamIDs; resume && st != nil && st.Stream == cfg.Stream && st.Partitions == cfg.Partitions {
		p.ids = slices.Clone(st.IDs)
		// What the broker holds above the stored ids is the tail the last
		// term published and did not acknowledge: this term publishes it
		// again with the same ids, and the broker drops it.
		broker, err := sp.pub.LastIDs(cfg.Producer)
		if err != nil {
			return err
		}
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
	last, err := sp.startAbove(cfg.Producer)
	if err != nil {
		return err
	}
	p.ids = last
	p.r.log.Info("stream destination: starting above the broker's last publishing ids (at least once until the next stored position)",
		zap.Uint64s("ids", p.ids), zap.Bool("stored_ids", progress.StreamIDs != nil), zap.Bool("resume", resume))
	return nil
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
// "<relay-name>-delayed-<i>" for the due-time sweep, which runs beside the
// lanes and must not share their sequence.
type streamPub struct {
	r      *Relay
	pub    *streams.Publisher
	leader lease
	next   int // the partition of the next lane NewSink opens
}

// delayedSuffix names the due-time sweep's producers.
const delayedSuffix = "-delayed"

// openStreamPub is binlog mode's openBinlog with the stream destination.
func (r *Relay) openStreamPub(ctx context.Context, leader lease) (binlogPublisher, error) {
	pub, err := streams.Dial(r.cfg.Stream)
	if err != nil {
		return nil, err
	}
	r.state.setPublisher(pub)
	return &streamPub{r: r, pub: pub, leader: leader}, nil
}

// startAbove makes the producers "<prefix>-<i>" number what they send
// above the broker's last ids for them, and returns, per partition, the
// highest of those and of what they sent already.
func (s *streamPub) startAbove(prefix string) ([]uint64, error) {
	last, err := s.pub.LastIDs(prefix)
	if err != nil {
		return nil, err
	}
	for i := range last {
		pr, err := s.pub.Producer(prefix, i)
		if err != nil {
			return nil, err
		}
		pr.StartAbove(last[i])
		last[i] = pr.Last()
	}
	return last, nil
}

// Connected: the stream client reconnects nothing; a lost connection fails
// the producers, which ends the term.
func (s *streamPub) Connected() (bool, <-chan struct{}) { return true, nil }

// NewSink opens the lane of the next partition (the lanes are opened in
// partition order).
func (s *streamPub) NewSink(onResult func(publish.Result)) (sink, error) {
	pr, err := s.pub.Producer(s.r.cfg.Stream.Producer, s.next)
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
	return s.r.newPoller(routerPub{s.pub, s.r.cfg.Stream.Producer}, s.leader)
}

// DelayedSweeper delivers due delayed rows into the streams through
// producers of their own, numbered above the broker's last ids for them
// (opened at the first delayed row).
func (s *streamPub) DelayedSweeper() (delayedSweeper, time.Duration, error) {
	pl, err := s.r.newPoller(routerPub{s.pub, s.r.cfg.Stream.Producer + delayedSuffix}, s.leader)
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
// worker gets a router over the producers "<prefix>-<i>".
type routerPub struct {
	pub    *streams.Publisher
	prefix string
}

func (r routerPub) NewChannel(onResult func(publish.Result)) (poller.Channel, error) {
	return r.pub.NewRouter(r.prefix, onResult), nil
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
	pub, err := streams.Dial(r.cfg.Stream)
	if err != nil {
		return nil, nil, err
	}
	r.state.setPublisher(pub)
	sp := &streamPub{r: r, pub: pub, leader: leader}
	p, err := r.newPoller(routerPub{pub, r.cfg.Stream.Producer}, leader)
	if err != nil {
		pub.Close()
		return nil, nil, err
	}
	return sp, p, nil
}
