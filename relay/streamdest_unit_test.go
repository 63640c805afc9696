package relay

import (
	"fmt"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// streamTxns are six transactions of rows over keys k0…k6 and the key ”.
func streamTxns() []txn {
	var txns []txn
	id := uint64(0)
	for tx := 0; tx < 6; tx++ {
		var rows []*outbox.Record
		for r := 0; r < 5; r++ {
			id++
			key := "" // every fourth row: no ordering constraint
			if id%4 != 0 {
				key = fmt.Sprintf("k%d", id%7)
			}
			rows = append(rows, rec(id, key))
		}
		txns = append(txns, txn{rows: rows, pos: filePos(uint32(100 * (tx + 1)))})
	}
	return txns
}

// streamRun reads txns in a stream pipeline of 4 partitions whose ids start
// above start, confirms the rows of the first confirm transactions, and
// returns each row's publishing id and partition, and the ids stored with
// the last position.
func streamRun(t *testing.T, start []uint64, txns []txn, confirm int) (seq map[uint64]uint64, part map[uint64]int, stored []uint64) {
	t.Helper()
	u := startUnitPipeline(t, func(c *Config) { c.Stream = streams.Config{Stream: "s", Partitions: 4} })
	u.p.ids = slices.Clone(start)
	n := 0
	for _, tx := range txns {
		n += len(tx.rows)
	}
	u.read(t, n, txns...)
	seq, part = map[uint64]uint64{}, map[uint64]int{}
	for i, s := range u.sinks {
		s.mu.Lock()
		for j, m := range s.published {
			seq[s.pubIDs[j]], part[s.pubIDs[j]] = m.Seq, i
		}
		s.mu.Unlock()
	}
	for _, tx := range txns[:confirm] {
		for _, r := range tx.rows {
			u.sinks[part[r.ID]].resolve(t, r.ID, publish.Confirmed, "")
		}
	}
	want := txns[confirm-1].pos
	u.store.until(t, "the position passes the confirmed transactions", func() bool {
		_, _, last := u.store.acked()
		return last.HasPos && last.Pos == want
	})
	_, _, last := u.store.acked()
	if last.StreamIDs == nil || last.StreamIDs.Stream != "s" || last.StreamIDs.Partitions != 4 {
		t.Fatalf("stream ids stored with %v: %+v", want, last.StreamIDs)
	}
	return seq, part, last.StreamIDs.IDs
}

// The publishing ids are a function of the binlog: each row goes to the
// partition of its key (murmur3, as the super-stream clients), each
// partition's ids count up by one from where the term started, the ids
// stored with a position are each partition's last id at that position,
// and a term that resumes from a stored position with the ids stored with
// it gives every later row the id it had before.
func TestUnitStreamIDsRepeatFromTheCheckpoint(t *testing.T) {
	txns := streamTxns()
	start := []uint64{10, 0, 5, 0}
	seq, part, storedAt3 := streamRun(t, start, txns, 3)

	next := slices.Clone(start)
	atPos3 := slices.Clone(start)
	for i, tx := range txns {
		for _, r := range tx.rows {
			want := streams.Partition(r.PartitionKey, r.MessageID.String(), 4)
			if part[r.ID] != want {
				t.Fatalf("row %d (key %q) went to partition %d, want %d", r.ID, r.PartitionKey, part[r.ID], want)
			}
			next[want]++
			if seq[r.ID] != next[want] {
				t.Fatalf("row %d: publishing id %d, want %d (partition %d)", r.ID, seq[r.ID], next[want], want)
			}
		}
		if i == 2 {
			copy(atPos3, next)
		}
	}
	if !slices.Equal(storedAt3, atPos3) {
		t.Fatalf("ids stored with the third transaction's position %v, want %v", storedAt3, atPos3)
	}

	// A restart from that position with those ids.
	again, _, final := streamRun(t, storedAt3, txns[3:], 3)
	for _, tx := range txns[3:] {
		for _, r := range tx.rows {
			if again[r.ID] != seq[r.ID] {
				t.Fatalf("after the restart row %d got id %d, before %d", r.ID, again[r.ID], seq[r.ID])
			}
		}
	}
	if !slices.Equal(final, next) {
		t.Fatalf("ids stored at the end %v, want %v", final, next)
	}
}
