package checkpoint

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/ordering"
)

// Ack is what one acknowledgement commits.
type Ack struct {
	Pos         Position // the new position; ignored when !HasPos
	HasPos      bool
	Mode        string // stored in the progress row when set ("binlog"|"poll")
	IDs         []ordering.Range
	Failed      []ordering.Failure
	LastEventAt time.Time
}

// Execer is what AckRows writes through: a *sql.Tx in practice, so the rows
// and whatever else the caller does commit together.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Ack commits one acknowledgement as a single transaction: failed rows copied
// to outbox_failed, acknowledged rows deleted (or marked), the position moved
// — all or nothing, and only while epoch is still the progress row's epoch
// (ErrFenced otherwise). A crash before the commit leaves everything as it was,
// so the rows are published again: duplicates are possible, loss is not.
func (s *Store) Ack(ctx context.Context, epoch int64, a Ack) (err error) {
	// READ COMMITTED: no gap locks, so acknowledging never waits on a
	// producer's uncommitted insert next to the acknowledged ids.
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fmt.Errorf("acknowledge: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var current int64
	if err := tx.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ? FOR UPDATE",
		s.cfg.RelayName).Scan(&current); err != nil {
		return fmt.Errorf("acknowledge: lock progress row of relay %q: %w", s.cfg.RelayName, err)
	}
	if current != epoch {
		return ErrFenced
	}
	if err := s.AckRows(ctx, tx, a.IDs, a.Failed); err != nil {
		return err
	}
	if a.HasPos || a.Mode != "" {
		var lastEvent any
		if !a.LastEventAt.IsZero() {
			lastEvent = a.LastEventAt.UTC()
		}
		p := a.Pos
		if _, err := tx.ExecContext(ctx, `UPDATE outbox_relay_progress SET
			flavor = IF(?, ?, flavor), gtid_set = IF(?, ?, gtid_set), binlog_file = IF(?, ?, binlog_file),
			binlog_pos = IF(?, ?, binlog_pos), mode = COALESCE(?, mode),
			last_event_at = GREATEST(COALESCE(last_event_at, ?), COALESCE(?, last_event_at))
			WHERE relay_name = ? AND epoch = ?`,
			a.HasPos, p.Flavor, a.HasPos, p.GTIDSet, a.HasPos, p.File, a.HasPos, p.Pos, nullIfEmpty(a.Mode),
			lastEvent, lastEvent, s.cfg.RelayName, epoch); err != nil {
			return fmt.Errorf("acknowledge: write position %s: %w", p.String(), err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("acknowledge %d rows: commit: %w", ordering.Count(a.IDs), err)
	}
	return nil
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// String renders the position for logs and errors.
func (p Position) String() string {
	if p.GTIDSet != "" {
		return fmt.Sprintf("%s gtid %q", p.Flavor, p.GTIDSet)
	}
	if p.File != "" {
		return fmt.Sprintf("%s %s:%d", p.Flavor, p.File, p.Pos)
	}
	return "no position"
}

// maxTerms bounds one statement's WHERE clause so a 200,000-row transaction
// acknowledges in statements of a sane size rather than one giant one.
const maxTerms = 500

// AckRows records failures in outbox_failed and deletes (or marks delivered)
// the rows in ids, through ex — the caller's transaction. Failed rows are
// among ids: they leave the outbox like the others so their partition moves on.
func (s *Store) AckRows(ctx context.Context, ex Execer, ids []ordering.Range, failed []ordering.Failure) error {
	if err := s.insertFailed(ctx, ex, failed); err != nil {
		return err
	}
	for len(ids) > 0 {
		n := min(len(ids), maxTerms)
		where, args := idClause(ids[:n])
		var q string
		// FORCE INDEX (PRIMARY): a table that empties and refills has stale
		// statistics, and the optimizer may otherwise scan (and lock) it all.
		// Single-table DELETE takes no index hint; the multi-table form does.
		if s.cfg.OnDelivered == Mark {
			q = "UPDATE `" + s.cfg.Table + "` FORCE INDEX (PRIMARY) SET delivered_at = NOW(6) WHERE (" + where + ") AND delivered_at IS NULL"
		} else {
			q = "DELETE o FROM `" + s.cfg.Table + "` AS o FORCE INDEX (PRIMARY) WHERE " + where
		}
		if _, err := ex.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("acknowledge %d rows of %s (%s): %w", ordering.Count(ids[:n]), s.cfg.Table, s.cfg.OnDelivered, err)
		}
		ids = ids[n:]
	}
	return nil
}

func idClause(rs []ordering.Range) (string, []any) {
	var (
		singles []any
		terms   []string
		args    []any
	)
	for _, r := range rs {
		if r.Lo == r.Hi {
			singles = append(singles, r.Lo)
			continue
		}
		terms = append(terms, "id BETWEEN ? AND ?")
		args = append(args, r.Lo, r.Hi)
	}
	if len(singles) > 0 {
		terms = append(terms, "id IN (?"+strings.Repeat(",?", len(singles)-1)+")")
		args = append(args, singles...)
	}
	return strings.Join(terms, " OR "), args
}

const failedColumns = "outbox_id, message_id, partition_key, exchange, routing_key, message_type, headers, " +
	"payload, content_type, created_at, available_at, error, source, failed_at"

func (s *Store) insertFailed(ctx context.Context, ex Execer, failed []ordering.Failure) error {
	for len(failed) > 0 {
		n := min(len(failed), 100)
		var (
			b    strings.Builder
			args []any
		)
		b.WriteString("INSERT INTO outbox_failed (" + failedColumns + ") VALUES ")
		for i, f := range failed[:n] {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString("(?,?,?,?,?,?,?,?,?,?,?,?,'relay',NOW(6))")
			r := f.Record
			var headers, available any
			if r.Headers != nil {
				headers = string(r.Headers)
			}
			if !r.AvailableAt.IsZero() {
				available = r.AvailableAt.UTC()
			}
			args = append(args, r.ID, r.MessageID[:], r.PartitionKey, r.Exchange, r.RoutingKey, r.MessageType,
				headers, r.Payload, r.ContentType, r.CreatedAt.UTC(), available, truncate(f.Reason, 1024))
		}
		if _, err := ex.ExecContext(ctx, b.String(), args...); err != nil {
			return fmt.Errorf("record %d failed messages in outbox_failed: %w", n, err)
		}
		failed = failed[n:]
	}
	return nil
}
