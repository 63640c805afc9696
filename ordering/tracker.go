package ordering

import (
	"cmp"
	"context"
	"slices"
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

// Batch is what may be acknowledged: rows that have an outcome, and — when
// HasPos — the position after the longest prefix of transactions whose every
// row has one. Rows of transactions not yet resolved may be in it: they may
// be acknowledged (deleted or marked) before the position moves past their
// transaction, never the other way round.
type Batch[P any] struct {
	Pos    P       // position after the last resolved transaction; valid when HasPos
	HasPos bool    // false when no transaction was resolved since the last batch
	IDs    []Range // rows published with any outcome: delete or mark them
	// MessageIDs holds the message id of each row of IDs, in the order IDs
	// lists them (its ranges in turn, each ascending): rows are
	// acknowledged by (id, message_id), never by id alone, because a lossy
	// failover can hand an acknowledged id to another message.
	MessageIDs  []outbox.MessageID
	Failed      []Failure // the subset that goes to outbox_failed
	LastEventAt time.Time // created_at of the newest row in the batch
	Txns        int       // transactions resolved, outbox or foreign
	Bytes       int64     // what the rows still hold of the budget: Release it once acknowledged
}

// Rows is the number of rows the batch acknowledges.
func (b *Batch[P]) Rows() int { return Count(b.IDs) }

// Empty reports whether the batch has neither rows nor a position.
func (b *Batch[P]) Empty() bool { return !b.HasPos && len(b.IDs) == 0 && len(b.Failed) == 0 }

// Merge appends a later batch to b. Acknowledging the merged batch is
// equivalent to acknowledging both in order, which lets the relay retry a
// failed acknowledgement together with what arrived meanwhile.
func (b *Batch[P]) Merge(later Batch[P]) {
	if later.HasPos {
		b.Pos, b.HasPos = later.Pos, true
	}
	for _, r := range later.IDs {
		if n := len(b.IDs); n > 0 && b.IDs[n-1].Hi+1 == r.Lo {
			b.IDs[n-1].Hi = r.Hi // consecutive transactions of one producer: keep one range
			continue
		}
		b.IDs = append(b.IDs, r)
	}
	b.MessageIDs = append(b.MessageIDs, later.MessageIDs...)
	b.Failed = append(b.Failed, later.Failed...)
	if later.LastEventAt.After(b.LastEventAt) {
		b.LastEventAt = later.LastEventAt
	}
	b.Txns += later.Txns
	b.Bytes += later.Bytes
}

// Ticket is one message handed to a lane; Done or Abandon resolves it
// exactly once.
type Ticket[P any] struct {
	txn  *txn[P]
	rec  *outbox.Record
	size int64
}

// Record is the row the ticket stands for.
func (tk *Ticket[P]) Record() *outbox.Record { return tk.rec }

type txn[P any] struct {
	pos     P
	closed  bool
	pending int // rows without an outcome
	rows    int // rows read
}

// Tracker follows transactions in binlog order from the moment their rows are
// read until they are acknowledged, and bounds in bytes what the relay holds
// meanwhile: a row is charged its Size (plus its reason when it failed) from
// Add until the acknowledgement that takes it out of the outbox commits and
// the caller Releases the batch's Bytes. Its payload is let go at its outcome
// unless it failed (it then goes to outbox_failed), so the charge bounds
// memory from above. While acknowledgements fail, reading stops once the
// budget is spent.
//
// Rows are handed out for acknowledgement as soon as they have an outcome,
// whatever the state of their transaction: a transaction larger than the
// budget could otherwise never finish. The position is handed out only past
// transactions whose every row has an outcome.
//
// One goroutine (the reader) calls Add and Commit in binlog order; any
// goroutine may call Done and Abandon, for the tickets in any order (the
// lanes' outcomes interleave, and within a lane a message held back by the
// broker is passed by other keys'); one goroutine (the acker) calls Take
// and Release. All methods are safe for concurrent use.
type Tracker[P any] struct {
	maxBytes int64
	mu       sync.Mutex
	bytes    int64     // charged: read and not yet released
	inflight int       // messages without an outcome
	queue    []*txn[P] // oldest first; the last may be open
	open     *txn[P]

	// Rows with an outcome that Take has not handed out yet.
	done      []doneRow
	failed    []Failure
	doneBytes int64
	doneAt    time.Time

	released chan struct{} // closed and replaced whenever the charge or inflight drops
	changed  chan struct{} // capacity 1: there may be something to Take
}

// New returns a tracker that holds at most maxBytes (see outbox.Record.Size)
// of rows read and not yet acknowledged. A single message larger than
// maxBytes is let through when nothing else is held, so no row can wedge
// the relay.
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
			tx.rows++
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
// row then goes to outbox_failed). Either way the row is to be acknowledged.
// Each ticket must be resolved exactly once, by Done or Abandon.
func (t *Tracker[P]) Done(tk *Ticket[P], delivered bool, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec := tk.rec
	tk.rec = nil // a delivered row's payload is no longer needed: let it go
	kept := tk.size
	if !delivered {
		t.failed = append(t.failed, Failure{Record: rec, Reason: reason})
		kept += int64(len(reason))
	}
	t.done = append(t.done, doneRow{rec.ID, rec.MessageID})
	if rec.CreatedAt.After(t.doneAt) {
		t.doneAt = rec.CreatedAt
	}
	t.doneBytes += kept
	t.bytes += kept - tk.size
	t.resolve(tk.txn)
}

// Abandon resolves a ticket whose message was never handed to a lane:
// it has no outcome and must not be acknowledged (nor recorded as failed).
// Its transaction never resolves, so the position never moves past it;
// only a reader that stops reading calls it.
func (t *Tracker[P]) Abandon(tk *Ticket[P]) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tk.rec = nil
	t.bytes -= tk.size
	t.resolve(tk.txn)
}

func (t *Tracker[P]) resolve(tx *txn[P]) {
	tx.pending--
	t.inflight--
	t.wake()
	t.signal()
}

// wake lets blocked Add and WaitIdle calls look again.
func (t *Tracker[P]) wake() {
	close(t.released)
	t.released = make(chan struct{})
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
			if last.closed && last.pending == 0 && last.rows == 0 {
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

// Changed receives (at least once) after there may be something to Take.
func (t *Tracker[P]) Changed() <-chan struct{} { return t.changed }

// Take hands out, as one batch, every row that got an outcome since the last
// Take (ids sorted and merged into ranges) and the position after the prefix
// of transactions that became fully resolved; ok is false when there is
// neither. The batch's rows keep their charge until Release.
func (t *Tracker[P]) Take() (b Batch[P], ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for n < len(t.queue) && t.queue[n].closed && t.queue[n].pending == 0 {
		b.Pos, b.HasPos = t.queue[n].pos, true
		t.queue[n] = nil
		n++
	}
	t.queue = t.queue[n:]
	b.Txns = n
	b.IDs, b.MessageIDs = rowsOf(t.done)
	b.Failed, b.Bytes, b.LastEventAt = t.failed, t.doneBytes, t.doneAt
	t.done, t.failed, t.doneBytes, t.doneAt = nil, nil, 0, time.Time{}
	return b, !b.Empty()
}

// Release gives back the budget of acknowledged rows: a batch's Bytes once
// its acknowledgement committed.
func (t *Tracker[P]) Release(bytes int64) {
	if bytes == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bytes -= bytes
	t.wake()
}

// Inflight reports the messages without an outcome, and the bytes charged to
// the budget: everything read and not yet acknowledged.
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

// doneRow is a row with an outcome: what acknowledging it needs.
type doneRow struct {
	id  uint64
	mid outbox.MessageID
}

// rowsOf sorts rows by id (in place) and returns them as ranges and the
// message ids in the same order, as Batch holds them.
func rowsOf(rows []doneRow) ([]Range, []outbox.MessageID) {
	if len(rows) == 0 {
		return nil, nil
	}
	slices.SortFunc(rows, func(a, b doneRow) int { return cmp.Compare(a.id, b.id) })
	var rs []Range
	mids := make([]outbox.MessageID, len(rows))
	for i, r := range rows {
		rs = addID(rs, r.id)
		mids[i] = r.mid
	}
	return rs, mids
}
