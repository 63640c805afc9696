package checkpoint

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// Ack is what one acknowledgement commits.
type Ack struct {
	Pos         position.Position // the new position; ignored when !HasPos
	HasPos      bool
	Mode        string // stored in the progress row when set ("binlog"|"poll")
	IDs         []ordering.Range
	MessageIDs  []outbox.MessageID // of each row of IDs, in IDs' order (ordering.Batch.MessageIDs)
	Failed      []ordering.Failure
	LastEventAt time.Time
	// StreamIDs are the stream destination's publishing ids at Pos, stored
	// with it (HasPos only). nil stores NULL: any position written without
	// them (a leader publishing to exchanges) no longer has ids that
	// continue it.
	StreamIDs *StreamIDs
}

// Execer is what AckRows writes through: a *sql.Tx in practice, so the rows
// and whatever else the caller does commit together.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Ack commits one acknowledgement: failed rows copied to outbox_failed,
// acknowledged rows deleted (or marked), the position moved — each only while
// epoch is still the progress row's epoch (ErrFenced otherwise).
//
// The rows go in transactions of at most ackChunk rows each, every one fenced
// by the epoch, and the position (with Mode and LastEventAt) in the last of
// them: the progress row, which the leadership heartbeat updates under a
// timeout, is locked for one chunk's commit at a time, never for the whole
// of a large acknowledgement. So the position moves only once every row is
// acknowledged; rows acknowledged before a crash or an error whose position
// was not written are read from the binlog and published again (duplicates
// are possible, loss is not), and acknowledging them again is harmless: their
// delete (or mark) does nothing and a failed row already in outbox_failed is
// not recorded twice. A failed Ack can therefore simply be retried, merged
// with what came after it.
//
// Its transactions run on a connection of the store's own that holds a poll
// lock of the relay name (ackSession says why); one Ack runs at a time.
func (s *Store) Ack(ctx context.Context, epoch int64, a Ack) error {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	return s.acks.ack(ctx, epoch, a)
}

// txBeginner is where an acknowledgement's transactions run: the pool, or
// an AckSession's connection.
type txBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// ack is Ack with its transactions on db; afterRows, when not nil, runs in
// each transaction once its rows are acknowledged (tests stop a leader
// there).
func (s *Store) ack(ctx context.Context, db txBeginner, afterRows func(), epoch int64, a Ack) error {
	var failedByID map[uint64][]ordering.Failure
	if len(a.Failed) > 0 {
		failedByID = make(map[uint64][]ordering.Failure, len(a.Failed))
		for _, f := range a.Failed {
			failedByID[f.Record.ID] = append(failedByID[f.Record.ID], f)
		}
	}
	if n := ordering.Count(a.IDs); len(a.MessageIDs) != n {
		return fmt.Errorf("acknowledge: %d message ids for %d rows", len(a.MessageIDs), n)
	}
	mids := a.MessageIDs
	for rest, done := a.IDs, 0; ; {
		var chunk []ordering.Range
		chunk, rest = splitRanges(rest, ackChunk)
		var chunkMids []outbox.MessageID
		chunkMids, mids = mids[:ordering.Count(chunk)], mids[ordering.Count(chunk):]
		failed := takeFailed(failedByID, chunk)
		var final *Ack
		if len(rest) == 0 {
			final = &a
			failed = append(failed, leftFailed(failedByID)...) // not among IDs: record them anyway
		}
		if err := s.ackTx(ctx, db, afterRows, epoch, chunk, chunkMids, failed, final); err != nil {
			if done > 0 {
				return fmt.Errorf("after %d of %d rows: %w", done, ordering.Count(a.IDs), err)
			}
			return err
		}
		if final != nil {
			return nil
		}
		done += ordering.Count(chunk)
	}
}

// ackTx commits one transaction of Ack: ids, failed and, when final is not
// nil, the position. The epoch is checked last, just before the commit, with
// a lock on the progress row that lasts only until the commit: shared for a
// chunk of rows, exclusive when the row is written. A newer leader's epoch
// bump therefore either waits for this commit or makes it fail.
func (s *Store) ackTx(ctx context.Context, db txBeginner, afterRows func(), epoch int64, ids []ordering.Range, mids []outbox.MessageID, failed []ordering.Failure, final *Ack) (err error) {
	if len(ids) == 0 && len(failed) == 0 && (final == nil || !final.HasPos && final.Mode == "") {
		return nil
	}
	if len(ids) == 0 && len(failed) == 0 {
		return s.writeProgress(ctx, epoch, final)
	}
	// READ COMMITTED: no gap locks, so acknowledging never waits on a
	// producer's uncommitted insert next to the acknowledged ids.
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fmt.Errorf("acknowledge: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if len(failed) > 0 {
		if failed, err = s.unrecorded(ctx, tx, failed); err != nil {
			return err
		}
	}
	if err := s.AckRows(ctx, tx, ids, mids, failed); err != nil {
		return err
	}
	if afterRows != nil {
		afterRows()
	}
	write := final != nil && (final.HasPos || final.Mode != "")
	lock := "LOCK IN SHARE MODE"
	if write {
		lock = "FOR UPDATE"
	}
	var current int64
	if err := tx.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ? "+lock,
		s.cfg.RelayName).Scan(&current); err != nil {
		return fmt.Errorf("acknowledge: lock progress row of relay %q: %w", s.cfg.RelayName, err)
	}
	if current != epoch {
		return ErrFenced
	}
	if write {
		if _, err := s.updateProgress(ctx, tx, epoch, final); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("acknowledge %d rows: commit: %w", ordering.Count(ids), err)
	}
	return nil
}

// writeProgress writes a's position and mode, and nothing else, in one
// statement fenced by the epoch (an idle binlog relay moving its position
// past other tables' transactions): ErrFenced when the row is at another
// epoch.
func (s *Store) writeProgress(ctx context.Context, epoch int64, a *Ack) error {
	n, err := s.updateProgress(ctx, s.db, epoch, a)
	if err != nil || n > 0 {
		return err
	}
	// No row changed: a newer epoch, or nothing to change.
	var current int64
	if err := s.db.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ?",
		s.cfg.RelayName).Scan(&current); err != nil {
		return fmt.Errorf("acknowledge: read the epoch of relay %q: %w", s.cfg.RelayName, err)
	}
	if current != epoch {
		return ErrFenced
	}
	return nil
}

// updateProgress writes a's position, mode and last_event_at where the epoch
// is still epoch, and returns how many rows changed.
func (s *Store) updateProgress(ctx context.Context, db Execer, epoch int64, a *Ack) (int64, error) {
	var lastEvent any
	if !a.LastEventAt.IsZero() {
		lastEvent = a.LastEventAt.UTC()
	}
	p := a.Pos
	ids, err := encodeStreamIDs(a.StreamIDs)
	if err != nil {
		return 0, err
	}
	// The stream ids go in the same statement as the position: they always
	// describe the same point.
	res, err := db.ExecContext(ctx, `UPDATE outbox_relay_progress SET
		flavor = IF(?, ?, flavor), gtid_set = IF(?, ?, gtid_set), binlog_file = IF(?, ?, binlog_file),
		binlog_pos = IF(?, ?, binlog_pos), stream_ids = IF(?, ?, stream_ids), mode = COALESCE(?, mode),
		last_event_at = GREATEST(COALESCE(last_event_at, ?), COALESCE(?, last_event_at))
		WHERE relay_name = ? AND epoch = ?`,
		a.HasPos, p.Flavor, a.HasPos, p.GTIDSet, a.HasPos, p.File, a.HasPos, p.Pos, a.HasPos, ids, nullIfEmpty(a.Mode),
		lastEvent, lastEvent, s.cfg.RelayName, epoch)
	if err != nil {
		return 0, fmt.Errorf("acknowledge: write position %s: %w", p.String(), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("acknowledge: write position %s: %w", p.String(), err)
	}
	return n, nil
}

// splitRanges returns the first ranges of rs holding at most limit ids, and
// the rest. rs is not modified.
func splitRanges(rs []ordering.Range, limit int) (head, rest []ordering.Range) {
	n := 0
	for i, r := range rs {
		size := r.Hi - r.Lo + 1
		if room := uint64(limit - n); size > room {
			if room == 0 {
				return rs[:i:i], rs[i:]
			}
			head = append(slices.Clip(rs[:i]), ordering.Range{Lo: r.Lo, Hi: r.Lo + room - 1})
			return head, append([]ordering.Range{{Lo: r.Lo + room, Hi: r.Hi}}, rs[i+1:]...)
		}
		n += int(size)
	}
	return rs, nil
}

// takeFailed removes from byID and returns the failures of the rows in ids.
func takeFailed(byID map[uint64][]ordering.Failure, ids []ordering.Range) []ordering.Failure {
	if len(byID) == 0 {
		return nil
	}
	var out []ordering.Failure
	for _, r := range ids {
		for id := r.Lo; ; id++ {
			if fs, ok := byID[id]; ok {
				out = append(out, fs...)
				delete(byID, id)
			}
			if id == r.Hi {
				break
			}
		}
	}
	return out
}

// leftFailed removes and returns what is left in byID, by id.
func leftFailed(byID map[uint64][]ordering.Failure) []ordering.Failure {
	var out []ordering.Failure
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		out = append(out, byID[id]...)
		delete(byID, id)
	}
	return out
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// ackChunk bounds the ids one acknowledging statement names, and one
// transaction of Ack: a 200,000-row transaction acknowledges in statements
// of a sane size, and locks the progress row for one chunk at a time.
const ackChunk = 1000

// AckRows records failures in outbox_failed and deletes (or marks delivered)
// the rows in ids, through ex — the caller's transaction. mids holds the
// message id of each row of ids, in ids' order: a row is acknowledged only
// when both its id and its message id match, because after a lossy
// failover the server hands out ids that were already published for other
// messages (docs/operations.md), and such a row must not be deleted or marked
// unpublished. Failed rows are among ids: they leave the outbox like the
// others so their partition moves on.
//
// The (id, message id) pairs reach the server as a JSON array that
// JSON_TABLE turns into a row source, joined STRAIGHT_JOIN to the outbox by
// primary key: an eq_ref point lookup per id, whatever the table's
// statistics say, the message id compared on the row found. The obvious
// forms are not safe. A queue table's row estimate is often near zero (it
// empties between bursts), and with such an estimate MariaDB plans
// "DELETE ... WHERE id IN (...)" and even "DELETE o FROM t o FORCE INDEX
// (PRIMARY) WHERE id BETWEEN ..." as full scans; a locking full scan waits
// on every row another transaction holds, so two poll workers deadlock
// (each scanning into the other's rows) and the binlog relay's ack waits
// on producers' uncommitted inserts. A BETWEEN range also locks the record
// just past it. Point lookups lock exactly the rows named.
func (s *Store) AckRows(ctx context.Context, ex Execer, ids []ordering.Range, mids []outbox.MessageID, failed []ordering.Failure) error {
	if n := ordering.Count(ids); len(mids) != n {
		return fmt.Errorf("acknowledge rows of %s: %d message ids for %d rows", s.cfg.Table, len(mids), n)
	}
	if err := s.insertFailed(ctx, ex, failed); err != nil {
		return err
	}
	var b strings.Builder
	for len(ids) > 0 {
		b.Reset()
		var n int
		ids, n = appendJSONIDs(&b, ids, mids, ackChunk)
		mids = mids[n:]
		if _, err := ex.ExecContext(ctx, s.ackStatement(b.String())); err != nil {
			return fmt.Errorf("acknowledge %d rows of %s (%s): %w", n, s.cfg.Table, s.cfg.OnDelivered, err)
		}
	}
	return nil
}

// ackStatement deletes (or marks) the rows whose (id, message id) pairs are
// in the JSON array list ([[id,"hex message id"],...]). The values are
// integers and hex digits, inlined: no prepare round trip.
func (s *Store) ackStatement(list string) string {
	from := "JSON_TABLE('" + list + "', '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]', mid CHAR(32) PATH '$[1]')) AS acked" +
		" STRAIGHT_JOIN `" + s.cfg.Table + "` AS o ON o.id = acked.id AND o.message_id = UNHEX(acked.mid)"
	if s.cfg.OnDelivered == Mark {
		return "UPDATE " + from + " SET o.delivered_at = NOW(6) WHERE o.delivered_at IS NULL"
	}
	return "DELETE o FROM " + from
}

// appendJSONIDs writes up to limit rows of rs, with their message ids from
// mids (in rs' order), as a JSON array of [id,"hex"] pairs to b and returns
// the ranges left and how many rows it wrote. rs is not modified.
func appendJSONIDs(b *strings.Builder, rs []ordering.Range, mids []outbox.MessageID, limit int) ([]ordering.Range, int) {
	n := 0
	b.WriteByte('[')
	for len(rs) > 0 && n < limit {
		lo, hi := rs[0].Lo, rs[0].Hi
		take := min(hi-lo+1, uint64(limit-n))
		for id := lo; id < lo+take; id++ {
			if n > 0 {
				b.WriteByte(',')
			}
			b.WriteByte('[')
			b.WriteString(strconv.FormatUint(id, 10))
			b.WriteString(`,"`)
			b.WriteString(hex.EncodeToString(mids[n][:]))
			b.WriteString(`"]`)
			n++
		}
		if lo+take > hi {
			rs = rs[1:]
		} else {
			rs = append([]ordering.Range{{Lo: lo + take, Hi: hi}}, rs[1:]...)
		}
	}
	b.WriteByte(']')
	return rs, n
}

// Pending returns which of ids are still pending in the outbox: present
// (delete mode) or present and not marked delivered (mark mode). The
// handover uses it to skip rows its sweep already delivered.
func (s *Store) Pending(ctx context.Context, ids []uint64) (map[uint64]bool, error) {
	pending := make(map[uint64]bool, len(ids))
	if len(ids) == 0 {
		return pending, nil
	}
	var b strings.Builder
	for len(ids) > 0 {
		n := min(len(ids), ackChunk)
		b.Reset()
		b.WriteString("SELECT id FROM `" + s.cfg.Table + "` WHERE id IN (")
		for i, id := range ids[:n] {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatUint(id, 10))
		}
		b.WriteByte(')')
		if s.cfg.OnDelivered == Mark {
			b.WriteString(" AND delivered_at IS NULL")
		}
		if err := s.scanIDs(ctx, b.String(), pending); err != nil {
			return nil, fmt.Errorf("check which of %d rows of %s are still pending: %w", n, s.cfg.Table, err)
		}
		ids = ids[n:]
	}
	return pending, nil
}

func (s *Store) scanIDs(ctx context.Context, query string, into map[uint64]bool) error {
	rows, err := s.db.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id uint64
		if err := rows.Scan(&id); err != nil {
			return err
		}
		into[id] = true
	}
	return rows.Err()
}
