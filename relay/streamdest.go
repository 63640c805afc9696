package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/outbox"
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

// startIDs sets the ids the term continues from, before anything is read:
// the stored ones when resume (the term tails from exactly the stored
// position) and they are for this stream and partition count; otherwise
// the broker's last id of each producer.
func (p *pipeline) startIDs(progress checkpoint.Progress, resume bool) error {
	sp, ok := p.pub.(*streamPub)
	if !ok {
		return nil
	}
	cfg := p.r.cfg.Stream
	if st := progress.StreamIDs; resume && st != nil && st.Stream == cfg.Stream && st.Partitions == cfg.Partitions {
		p.ids = slices.Clone(st.IDs)
		p.r.log.Info("stream destination: continuing the stored publishing ids (exactly once)", zap.Uint64s("ids", p.ids))
		return nil
	}
	last, err := sp.pub.LastIDs()
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

// streamPub is binlog mode's publisher with the stream destination: the
// stream connection and a producer per partition (opened by the lanes in
// partition order).
type streamPub struct {
	r    *Relay
	pub  *streams.Publisher
	mu   sync.Mutex
	next int
}

// openStreamPub is binlog mode's openBinlog with the stream destination.
func (r *Relay) openStreamPub(ctx context.Context, _ lease) (binlogPublisher, error) {
	pub, err := streams.Dial(r.cfg.Stream)
	if err != nil {
		return nil, err
	}
	return &streamPub{r: r, pub: pub}, nil
}

// Connected: the stream client reconnects nothing; a lost connection fails
// the producers, which ends the term.
func (s *streamPub) Connected() (bool, <-chan struct{}) { return true, nil }

func (s *streamPub) NewSink(onResult func(publish.Result)) (sink, error) {
	s.mu.Lock()
	i := s.next
	s.next++
	s.mu.Unlock()
	return s.pub.Open(i, 0, onResult)
}

// Drainer: delivering pending rows by polling into the streams is not
// built; a start that needs it (first start, after poll mode, an accepted
// lossy failover) goes on only when no row is pending.
func (s *streamPub) Drainer() (drainer, error) { return pendingRefusal{r: s.r}, nil }

// DelayedSweeper: delayed rows are not delivered into the streams yet.
func (s *streamPub) DelayedSweeper() (delayedSweeper, time.Duration, error) {
	return pendingRefusal{r: s.r, delayed: true}, time.Second, nil
}

func (s *streamPub) Close() error { return s.pub.Close() }

// errNoStreamPolling is the refusal of what the stream destination cannot
// deliver yet: rows that only polling would deliver.
var errNoStreamPolling = errors.New("the stream destination publishes from the binlog only: delivering rows " +
	"pending before the binlog position, and delayed rows (available_at set), into streams by polling is not built yet; " +
	"deliver them with a relay without --stream (or delete them), then start the stream relay again")

// pendingRefusal stands for the poller with the stream destination: it
// delivers nothing, and refuses when there is something to deliver.
type pendingRefusal struct {
	r       *Relay
	delayed bool
}

func (d pendingRefusal) pending(ctx context.Context) (bool, error) {
	q := "SELECT 1 FROM `" + d.r.cfg.Table + "` WHERE delivered_at IS NULL"
	if d.delayed {
		q += " AND available_at IS NOT NULL"
	}
	var one int
	err := d.r.db.QueryRowContext(ctx, q+" LIMIT 1").Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check for pending rows in %s: %w", d.r.cfg.Table, err)
	}
	return true, nil
}

func (d pendingRefusal) DrainUntil(ctx context.Context, _ <-chan struct{}) (int, error) {
	if any, err := d.pending(ctx); err != nil || !any {
		return 0, err
	}
	return 0, &ConfigError{errNoStreamPolling}
}

func (d pendingRefusal) Pending(ctx context.Context) (bool, error) { return d.pending(ctx) }

func (d pendingRefusal) Round(ctx context.Context) (int, error) {
	if any, err := d.pending(ctx); err != nil || !any {
		return 0, err
	}
	return 0, &ConfigError{errNoStreamPolling}
}

func (d pendingRefusal) Close() error { return nil }

// laneCount is the number of publishing lanes: one per partition stream
// with the stream destination, Config.Lanes otherwise.
func (r *Relay) laneCount() int {
	if r.cfg.Stream.Enabled() {
		return r.cfg.Stream.Partitions
	}
	return r.cfg.Lanes
}
