package poller

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/sqltime"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// RecordColumns is the select list ScanRecord reads, in its order. Readers
// of whole outbox rows (the relay's pending-row checks) use the pair so the
// column list and the scan stay in one place.
const RecordColumns = "id, message_id, partition_key, exchange, routing_key, message_type, headers, payload, " +
	"content_type, created_at, available_at"

// Scanner is *sql.Rows or *sql.Row.
type Scanner interface {
	Scan(dest ...any) error
}

// ScanRecord reads one row selected with RecordColumns. DATETIME values are
// taken as UTC, whether the pool parses times (parseTime=true, loc=UTC) or
// hands them over as text.
func ScanRecord(s Scanner) (*outbox.Record, error) {
	var (
		rec                outbox.Record
		messageID, headers []byte
		created, available sqltime.UTC
	)
	if err := s.Scan(&rec.ID, &messageID, &rec.PartitionKey, &rec.Exchange, &rec.RoutingKey,
		&rec.MessageType, &headers, &rec.Payload, &rec.ContentType, &created, &available); err != nil {
		return nil, err
	}
	if len(messageID) != len(rec.MessageID) {
		return nil, fmt.Errorf("row %d: message_id is %d bytes, want %d", rec.ID, len(messageID), len(rec.MessageID))
	}
	copy(rec.MessageID[:], messageID)
	rec.Headers = headers
	rec.CreatedAt, rec.AvailableAt = created.T, available.T
	return &rec, nil
}

// queries holds the SQL of a round, built once from the table name.
//
// Pending is "delivered_at IS NULL" in both modes: the relay never sets
// delivered_at in delete mode, and a row an earlier mark-mode run marked
// counts as delivered whatever the mode is now. The condition is also what
// lets the head listing read idx_head in order: with delivered_at and
// available_at both IS NULL, idx_head's entries are in (partition_key, id)
// order.
//
// Due is tested with UTC_TIMESTAMP(6), not NOW(6): available_at is stored in
// UTC, and UTC_TIMESTAMP does not depend on the session's time_zone.
type queries struct {
	table string // backquoted
	mark  bool   // --on-delivered=mark: delivered rows stay in the table
}

const due = "(available_at IS NULL OR available_at <= UTC_TIMESTAMP(6))"

// bound restricts a statement to ids up to maxID (Drain); 0 means none.
func bound(maxID uint64) string { return boundOn("id", maxID) }

func boundOn(column string, maxID uint64) string {
	if maxID == 0 {
		return ""
	}
	return " AND " + column + " <= " + strconv.FormatUint(maxID, 10)
}

// candidate is one row of the candidates statement.
type candidate struct {
	id     uint64
	key    string // partition_key
	branch int    // 1 for the cursor branch (heads over immediate rows)
}

// candidates returns the statement (and its arguments) that lists the ids
// a round may claim. It takes no locks, and with an empty cursor it has no
// placeholders, so an idle round is one COM_QUERY. Five branches:
//
//  1. The first limit pending rows with available_at NULL and
//     partition_key > cursor, in idx_head order (partition key, then id):
//     each listed partition's head over immediate rows, and some of the
//     rows after it. A range read of limit index entries, whatever the
//     table's statistics say, so its cost grows neither with the number of
//     partitions nor with their length. (A loose index scan, MIN(id) GROUP
//     BY partition_key, needs one dive per partition, but MariaDB chooses
//     it from statistics: on a queue table they are often stale, and it
//     then read every row of each partition instead — 50,000 to 100,000
//     index entries per call in a third of a drain's calls.)
//     In mark mode branch 1 is that GROUP BY all the same: a partition's
//     delivered rows follow its pending ones in idx_head, so the listing
//     would read through every partition's delivered history, which the
//     loose scan jumps over.
//
//  2. For every partition with pending delayed rows that are now due
//     (read through idx_due; as many as such rows): the smaller of their
//     MIN(id) and the partition's MIN(id) over pending immediate rows (one
//     idx_head dive), so such a partition's head is right even when it lies
//     outside branch 1's key range.
//
//  3. and 4. The oldest pending due rows with an empty partition_key, immediate
//     and delayed, at most limit each.
//
//  5. The oldest limit pending immediate rows with a partition key, in id
//     order (idx_due, one primary-key lookup each for the key): with
//     deep partitions branch 1 lists the heads of a few partitions only,
//     and a round of their rows has one message per key on the wire at
//     a time; the oldest rows list the head of every partition they hold,
//     so a round spans as many keys as the backlog interleaves.
//
//  6. For each of the known partitions (those the previous listing saw,
//     when they were fewer than a batch),
//     its oldest pending immediate row: one idx_head dive each. Branches 1
//     and 5 find a few new partitions per round when partitions are deep
//     and written in bulk; the partitions found stay listed while they have
//     rows, so the rounds span every partition of such a backlog after a
//     while, not only the few its oldest rows hold.
//
// The caller takes each partition's smallest id over branches 1, 2, 5 and
// 6: its head, the oldest pending due row. (A partition's first row in branch
// 5 is its oldest pending immediate row: every older one has a smaller id
// and is listed before it.)
func (q queries) candidates(cursor string, known []string, limit int, maxID uint64) (string, []any) {
	l, b, t := strconv.Itoa(limit), bound(maxID), q.table
	var args []any
	after := "partition_key <> ''"
	if cursor != "" {
		after = "partition_key > ?"
		args = append(args, cursor)
	}
	// Branch 6: the head of each partition an earlier listing saw (one
	// idx_head dive each).
	var branch6 strings.Builder
	for range known {
		branch6.WriteString(" UNION ALL (SELECT id, partition_key, 6 FROM " + t + " FORCE INDEX (idx_head)" +
			" WHERE partition_key = ? AND delivered_at IS NULL AND available_at IS NULL" + b + " ORDER BY id LIMIT 1)")
	}
	from := " FROM " + t + " FORCE INDEX (idx_head)" +
		" WHERE " + after + " AND delivered_at IS NULL AND available_at IS NULL" + b
	branch1 := "(SELECT id, partition_key, 1 AS branch" + from + " ORDER BY partition_key, id LIMIT " + l + ")"
	if q.mark {
		branch1 = "(SELECT MIN(id) AS id, partition_key, 1 AS branch" + from +
			" GROUP BY partition_key ORDER BY partition_key LIMIT " + l + ")"
	}
	// Branch 5: the oldest pending immediate rows with a partition key, in
	// id order (idx_due's entries for delivered_at and available_at NULL
	// are in id order): a partition's first row here is its head over
	// immediate rows. Branch 1 lists the heads of the few partitions that
	// come first in key order when those are deep; this one lists the heads
	// of as many partitions as the oldest rows hold, so that a round spans
	// keys whenever the backlog interleaves them.
	branch5 := "(SELECT id, partition_key, 5 FROM " + t + " FORCE INDEX (idx_due)" +
		" WHERE delivered_at IS NULL AND available_at IS NULL AND partition_key <> ''" + b +
		" ORDER BY id LIMIT " + l + ")"
	return branch1 +
		" UNION ALL " + branch5 +
		" UNION ALL " +
		"(SELECT LEAST(MIN(d.id), COALESCE((SELECT i.id FROM " + t + " i FORCE INDEX (idx_head)" +
		" WHERE i.partition_key = d.partition_key AND i.delivered_at IS NULL AND i.available_at IS NULL" +
		boundOn("i.id", maxID) + " ORDER BY i.id LIMIT 1), d.id)), d.partition_key, 2 FROM " + t + " d" +
		" WHERE d.partition_key <> '' AND d.delivered_at IS NULL AND d.available_at <= UTC_TIMESTAMP(6)" +
		boundOn("d.id", maxID) + " GROUP BY d.partition_key)" +
		" UNION ALL " +
		"(SELECT id, partition_key, 3 FROM " + t + " WHERE partition_key = '' AND delivered_at IS NULL AND available_at IS NULL" + b +
		" ORDER BY id LIMIT " + l + ")" +
		" UNION ALL " +
		"(SELECT id, partition_key, 4 FROM " + t + " WHERE partition_key = '' AND delivered_at IS NULL AND available_at <= UTC_TIMESTAMP(6)" + b +
		" ORDER BY id LIMIT " + l + ")" + branch6.String(), appendKeys(args, known)
}

func appendKeys(args []any, keys []string) []any {
	for _, k := range keys {
		args = append(args, k)
	}
	return args
}

// heads turns the candidates statement's rows into the ids to claim, oldest
// first: per partition the smallest id of branches 1 and 2, and every
// row with an empty partition_key — at most limit. It also returns where the
// next round's branch 1 starts: after the last partition this one listed
// when branch 1 was cut short by its limit, else from the start. (That
// partition may have been listed in part; its head was listed, and the
// round's followers take the rest of it.) keys are the partitions it lists.
func heads(cands []candidate, limit int) (ids []uint64, cursor string, keys []string) {
	head := map[string]uint64{}
	inBranch1 := 0
	for _, c := range cands {
		if c.branch == 1 {
			inBranch1++
			cursor = c.key
		}
		if c.key == "" {
			ids = append(ids, c.id)
			continue
		}
		if h, ok := head[c.key]; !ok || c.id < h {
			head[c.key] = c.id
		}
	}
	if inBranch1 < limit {
		cursor = ""
	}
	for k, id := range head {
		ids = append(ids, id)
		keys = append(keys, k)
	}
	slices.Sort(ids)
	return ids[:min(len(ids), limit)], cursor, keys
}

// claim returns the statement that locks, oldest first and at most limit,
// those of ids that are still pending and due and that no other
// transaction holds. A head another worker holds is skipped, which hides
// its whole partition: this worker saw no later row of it as a candidate.
// The ids are inlined (they are integers the database gave us), so the
// statement needs no prepare round trip. Callers pass at most
// maxClaimIDs: from 1,000 values on (in_predicate_conversion_threshold)
// MariaDB turns an IN list into a table value constructor joined to the
// table and sorted, which reads and locks every listed row before the
// LIMIT; below that the list is a PRIMARY range read in id order that stops
// at the LIMIT.
func (q queries) claim(ids []uint64, limit int) string {
	var b strings.Builder
	b.WriteString("SELECT " + RecordColumns + " FROM " + q.table + " FORCE INDEX (PRIMARY) WHERE id IN (")
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(id, 10))
	}
	b.WriteString(") AND delivered_at IS NULL AND " + due + " ORDER BY id LIMIT " + strconv.Itoa(limit) +
		" FOR UPDATE SKIP LOCKED")
	return b.String()
}

// followers returns the statement (and its arguments) that lists, without
// locking, the pending due rows after the given heads in their partitions,
// at most limit, and at most limit/len(heads) (rounded up) of each
// partition: one range read of idx_partition_id per partition, in id
// order, so the scan reads no more index entries than it returns (ORDER BY
// id over all of them would sort every pending row of the claimed
// partitions first). The rows of each partition come out in id order,
// partition after partition.
//
// The round then locks the listed ids with claim, by primary key. Locking
// in this statement instead would be wrong: a locking range scan also locks
// the index record just past each range — the next partition's first row,
// another worker's — so that worker's SKIP LOCKED would skip a row in the
// middle of its partition (order broken), and its DELETE would wait on the
// lock (deadlocks). Point lookups by primary key lock exactly the rows
// named.
func (q queries) followers(heads []*outbox.Record, limit int, maxID uint64) (string, []any) {
	var b strings.Builder
	args := make([]any, 0, 2*len(heads))
	// At most perKey rows of each partition, so that the round's rows
	// spread over its partitions: a partition's rows go to the broker one
	// confirm after another, so the round lasts as long as its longest
	// partition.
	perKey := strconv.Itoa((limit + len(heads) - 1) / len(heads))
	for i, h := range heads {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString("(SELECT id, partition_key FROM " + q.table + " FORCE INDEX (idx_partition_id)" +
			" WHERE partition_key = ? AND id > ? AND delivered_at IS NULL AND " + due + bound(maxID) +
			" ORDER BY id LIMIT " + perKey + ")")
		args = append(args, h.PartitionKey, h.ID)
	}
	b.WriteString(" LIMIT " + strconv.Itoa(limit))
	return b.String(), args
}

// maxClaimIDs is the most ids one claim statement lists.
const maxClaimIDs = 900

const fenceQuery = "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ? LOCK IN SHARE MODE"

func (q queries) maxID() string { return "SELECT COALESCE(MAX(id), 0) FROM " + q.table }

// querier is *sql.DB or *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// readCandidates runs a candidates or followers statement; followers rows
// have no branch column.
func readCandidates(ctx context.Context, db querier, query string, args ...any) ([]candidate, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var cands []candidate
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var c candidate
		dest := []any{&c.id, &c.key, &c.branch}
		if err := rows.Scan(dest[:len(cols)]...); err != nil {
			return nil, err
		}
		cands = append(cands, c)
	}
	return cands, rows.Err()
}

// readRecords runs a locking select of RecordColumns in tx.
func readRecords(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]*outbox.Record, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var recs []*outbox.Record
	for rows.Next() {
		rec, err := ScanRecord(rows)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, rows.Err()
}

// fence checks, inside tx and holding a shared lock on the progress row
// until the commit, that the row's epoch is still epoch: a new leader's
// epoch bump waits for this transaction, and this transaction does not
// commit under a newer epoch. checkpoint.ErrFenced when it moved.
func fence(ctx context.Context, tx *sql.Tx, relayName string, epoch int64) error {
	var current int64
	err := tx.QueryRowContext(ctx, fenceQuery, relayName).Scan(&current)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("fence: relay %q has no progress row: %w", relayName, checkpoint.ErrFenced)
	}
	if err != nil {
		return fmt.Errorf("fence: read epoch of relay %q: %w", relayName, err)
	}
	if current != epoch {
		return fmt.Errorf("fence: relay %q is at epoch %d, this poller at %d: %w", relayName, current, epoch, checkpoint.ErrFenced)
	}
	return nil
}
