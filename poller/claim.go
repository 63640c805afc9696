package poller

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Deep rounds: a round over fewer than Batch/deepRounds partitions takes
// up to deepRounds*Batch rows, when the listings have settled (the last
// one found no partition new to them, so few partitions means few in the
// backlog, not few seen yet). A few partitions' rows go out one confirm
// after another per partition; a deeper round spends its claim and commit
// (during which no message of those partitions is on the wire) on up to
// deepRounds times as many. Past its first Batch rows it takes another
// Batch only while that many, at the average size of the rows it holds,
// keep it within deepBytes.
const (
	deepRounds = 4
	deepBytes  = 16 << 20
)

// depth is how many rows a round over heads may hold in all.
func (w *worker) depth(heads []*outbox.Record, settled bool) int {
	if batch := w.p.cfg.Batch; !settled || len(heads)*deepRounds >= batch {
		return batch
	}
	return deepRounds * w.p.cfg.Batch
}

// claimRows locks the round's rows in tx: up to Batch of the candidate
// ids (the partitions' heads, oldest first), then as many of their
// partitions' following rows as the round's depth leaves room for. The
// rows come back in id order; none when another transaction holds every
// candidate.
func (w *worker) claimRows(ctx context.Context, tx *sql.Tx, ids []uint64, settled bool, maxID uint64) ([]*outbox.Record, error) {
	p := w.p
	recs, err := claim(ctx, tx, p.q, ids, p.cfg.Batch)
	if err != nil {
		return nil, fmt.Errorf("claim partition heads in %s: %w", p.cfg.Table, err)
	}
	var heads []*outbox.Record
	for _, r := range recs {
		if r.PartitionKey != "" {
			heads = append(heads, r)
		}
	}
	depth := w.depth(heads, settled)
	if room := depth - len(recs); room > 0 && len(heads) > 0 {
		// One index dive per listed head: with more heads than room
		// (a round over many short partitions), the oldest room heads
		// give a follower each at most; the others' followers become
		// heads of a later round.
		named := heads[:min(len(heads), room)]
		lock := lockAll
		if depth > p.cfg.Batch {
			lock = w.lockWithin(recs)
		}
		more, err := followers(ctx, tx, p.q, named, room, maxID, lock)
		if err != nil {
			return nil, fmt.Errorf("claim the following rows of %d partitions in %s: %w", len(named), p.cfg.Table, err)
		}
		recs = append(recs, more...)
	}
	slices.SortFunc(recs, func(a, b *outbox.Record) int { return cmp.Compare(a.ID, b.ID) })
	return recs, nil
}

// claim locks up to limit of ids (sorted) that are pending, due and not
// held by another transaction, oldest first, by primary key.
func claim(ctx context.Context, tx *sql.Tx, q queries, ids []uint64, limit int) ([]*outbox.Record, error) {
	var recs []*outbox.Record
	for len(ids) > 0 && len(recs) < limit {
		chunk := ids[:min(len(ids), maxClaimIDs)]
		ids = ids[len(chunk):]
		got, err := readRecords(ctx, tx, q.claim(chunk, limit-len(recs)))
		if err != nil {
			return nil, err
		}
		recs = append(recs, got...)
	}
	return recs, nil
}

// locker locks the listed ids (sorted) of a round's followers, oldest
// first, and returns the rows it locked; it may stop before the last id:
// the rows it did not lock are a gap the round's partitions end at.
type locker func(ctx context.Context, tx *sql.Tx, q queries, ids []uint64) ([]*outbox.Record, error)

// lockAll locks every listed id.
func lockAll(ctx context.Context, tx *sql.Tx, q queries, ids []uint64) ([]*outbox.Record, error) {
	return claim(ctx, tx, q, ids, len(ids))
}

// lockWithin is a deep round's locker: the ids that fill the round (held,
// its heads) to a batch, then a batch of ids at a time while the round,
// at the average size of the rows it holds, stays within deepBytes.
func (w *worker) lockWithin(held []*outbox.Record) locker {
	batch := w.p.cfg.Batch
	return func(ctx context.Context, tx *sql.Tx, q queries, ids []uint64) ([]*outbox.Record, error) {
		n, size := len(held), 0
		for _, r := range held {
			size += r.Size()
		}
		var locked []*outbox.Record
		for step := max(batch-n, 1); len(ids) > 0; step = batch {
			if n >= batch && size/n > (deepBytes-size)/batch {
				break
			}
			chunk := ids[:min(len(ids), step)]
			ids = ids[len(chunk):]
			got, err := claim(ctx, tx, q, chunk, len(chunk))
			if err != nil {
				return nil, err
			}
			for _, r := range got {
				size += r.Size()
			}
			n += len(got)
			locked = append(locked, got...)
		}
		return locked, nil
	}
}

// partitions is how many distinct non-empty partition keys recs have.
func partitions(recs []*outbox.Record) int {
	keys := map[string]bool{}
	for _, r := range recs {
		if r.PartitionKey != "" {
			keys[r.PartitionKey] = true
		}
	}
	return len(keys)
}

// followers claims up to limit pending due rows that follow the heads in
// their partitions: it lists them without locks, locks them by primary key
// with lock, and keeps of each partition the rows up to the first one it
// could not lock (or lock left unlocked), so a partition's rows go out
// without a gap. (No other round can hold a row of a partition whose head
// this round holds, so a gap means a foreign lock or lock's stop; the rows
// after it that were locked stay locked, unpublished, until commit, and a
// later round takes them.)
func followers(ctx context.Context, tx *sql.Tx, q queries, heads []*outbox.Record, limit int, maxID uint64, lock locker) ([]*outbox.Record, error) {
	query, args := q.followers(heads, limit, maxID)
	listed, err := readCandidates(ctx, tx, query, args...)
	if err != nil || len(listed) == 0 {
		return nil, err
	}
	ids := make([]uint64, len(listed))
	for i, c := range listed {
		ids[i] = c.id
	}
	slices.Sort(ids)
	locked, err := lock(ctx, tx, q, ids)
	if err != nil {
		return nil, err
	}
	byID := make(map[uint64]*outbox.Record, len(locked))
	for _, r := range locked {
		byID[r.ID] = r
	}
	var (
		out []*outbox.Record
		cut = map[string]bool{}
	)
	slices.SortFunc(listed, func(a, b candidate) int { return cmp.Compare(a.id, b.id) })
	for _, c := range listed { // per partition in id order
		r := byID[c.id]
		if r == nil || cut[c.key] {
			cut[c.key] = true
			continue
		}
		out = append(out, r)
	}
	return out, nil
}
