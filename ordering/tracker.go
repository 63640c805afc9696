package ordering

import (
	"context"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Failure is a message the relay gave up on: it is acknowledged like the
// others (so its partition moves on) and recorded in outbox_failed.
type Failure struct {
	Record *outbox.Record
	Reason string
}

// Batch is what may be acknowledged in one database transaction: the rows of
// a prefix of fully resolved transactions and the position after the last of
// them.
type Batch[P any] struct {
	Pos         P         // position after the last transaction in the batch
	HasPos      bool      // false for an empty batch
	IDs         []Range   // rows published with any outcome: delete or mark them
	Failed      []Failure // the subset that goes to outbox_failed
	LastEventAt time.Time // created_at of the newest row in the batch
	Txns        int       // transactions covered, outbox or foreign
}

// Rows is the number of rows the batch acknowledges.
func (b *Batch[P]) Rows() int { return Count(b.IDs) }

// Merge appends a later batch to b. Acknowledging the merged batch is
// equivalent to acknowledging both in order, which lets the relay retry a
// failed acknowledgement together with what arrived meanwhile.
func (b *Batch[P]) Merge(later Batch[P]) {
	if !later.HasPos {
		return
	}
	b.Pos, b.HasPos = later.Pos, true
	for _, r := range later.IDs {
		if n := len(b.IDs); n > 0 && b.IDs[n-1].Hi+1 == r.Lo {
			b.IDs[n-1].Hi = r.Hi // consecutive transactions of one producer: keep one range
			continue
		}
		b.IDs = append(b.IDs, r)
	}
	b.Failed = append(b.Failed, later.Failed...)
	if later.LastEventAt.After(b.LastEventAt) {
		b.LastEventAt = later.LastEventAt
	}
	b.Txns += later.Txns
}

// Ticket is one message handed to a lane; Done resolves it exactly once.
type Ticket[P any] struct {
	txn  *txn[P]
	rec  *outbox.Record
	size int64
}

// Record is the row the ticket stands for.
func (tk *Ticket[P]) Record() *outbox.Record { return tk.rec }

type txn[P any] struct {
	pos       P
	closed    bool
	pending   int
	ids       []Range
	failed    []Failure
	createdAt time.Time
}

// Tracker follows transactions in binlog order from the moment their rows are
// read until every message has an outcome, and bounds the bytes in flight.
//
// One goroutine (the reader) calls Add and Commit in binlog order; any
// goroutine may call Done; one goroutine (the acker) calls Take. All methods
// are safe for concurrent use.
type Tracker[P any] struct {
	maxBytes int64

	mu       sync.Mutex
	bytes    int64
	inflight int
	queue    []*txn[P] // oldest first; the last may be open
	open     *txn[P]
	released chan struct{} // closed and replaced whenever an outcome arrives
	changed  chan struct{} // capacity 1: a transaction may have become ackable
}

// New returns a tracker that holds at most maxBytes of messages without an
// outcome (see outbox.Record.Size). A single message larger than maxBytes is
// let through alone, so no row can wedge the relay.
func New[P any](maxBytes int64) *Tracker[P] {
	return &Tracker[P]{
		maxBytes: maxBytes,
		released: make(chan struct{}),
		changed:  make(chan struct{}, 1),
	}
}

// Add registers a row of the open transaction that is about to be published.
// It blocks while the budget is spent: that is how a full relay stops reading.
func (t *Tracker[P]) Add(ctx context.Context, rec *outbox.Record) (*Ticket[P], error) {
	size := int64(rec.Size())
	for {
		t.mu.Lock()
		if t.bytes == 0 || t.bytes+size <= t.maxBytes {
			if t.open == nil {
				t.open = &txn[P]{}
				t.queue = append(t.queue, t.open)
			}
			tx := t.open
			tx.pending++
			tx.ids = addID(tx.ids, rec.ID)
			if rec.CreatedAt.After(tx.createdAt) {
				tx.createdAt = rec.CreatedAt
			}
			t.bytes += size
			t.inflight++
			t.mu.Unlock()
			return &Ticket[P]{txn: tx, rec: rec, size: size}, nil
		}
		wait := t.released
		t.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Done records a message's outcome: delivered, or failed with a reason (the
// row then goes to outbox_failed). Each ticket must be resolved exactly once.
func (t *Tracker[P]) Done(tk *Ticket[P], delivered bool, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tx := tk.txn
	if !delivered {
		tx.failed = append(tx.failed, Failure{Record: tk.rec, Reason: reason})
	}
	tk.rec = nil // the payload is no longer needed: let it go
	tx.pending--
	t.bytes -= tk.size
	t.inflight--
	close(t.released)
	t.released = make(chan struct{})
	if tx.closed && tx.pending == 0 && len(t.queue) > 0 && t.queue[0] == tx {
		t.signal()
	}
}

// Commit ends the open transaction (or records a transaction without
// published rows) at pos, the position after it.
func (t *Tracker[P]) Commit(pos P) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tx := t.open
	t.open = nil
	if tx == nil {
		// A transaction with nothing to publish. Fold it into a trailing
		// empty one so a long run of foreign transactions costs no memory.
		if n := len(t.queue); n > 0 {
			last := t.queue[n-1]
			if last.closed && last.pending == 0 && len(last.ids) == 0 {
				last.pos = pos
				if n == 1 {
					t.signal()
				}
				return
			}
		}
		tx = &txn[P]{}
		t.queue = append(t.queue, tx)
	}
	tx.pos, tx.closed = pos, true
	if tx.pending == 0 && t.queue[0] == tx {
		t.signal()
	}
}

func (t *Tracker[P]) signal() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// Changed receives (at least once) after the watermark may have moved.
func (t *Tracker[P]) Changed() <-chan struct{} { return t.changed }

// Take removes the prefix of transactions whose every message has an outcome
// and returns it as one batch; ok is false when there is none.
func (t *Tracker[P]) Take() (b Batch[P], ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for n < len(t.queue) && t.queue[n].closed && t.queue[n].pending == 0 {
		tx := t.queue[n]
		b.Merge(Batch[P]{Pos: tx.pos, HasPos: true, IDs: tx.ids, Failed: tx.failed, LastEventAt: tx.createdAt, Txns: 1})
		t.queue[n] = nil
		n++
	}
	t.queue = t.queue[n:]
	return b, n > 0
}

// Inflight reports the messages and bytes that have no outcome yet.
func (t *Tracker[P]) Inflight() (messages int, bytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inflight, t.bytes
}

// WaitIdle blocks until every message added so far has an outcome.
func (t *Tracker[P]) WaitIdle(ctx context.Context) error {
	for {
		t.mu.Lock()
		if t.inflight == 0 {
			t.mu.Unlock()
			return nil
		}
		wait := t.released
		t.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
