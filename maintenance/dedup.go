package maintenance

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/sqltime"
)

// DefaultDedupFloor is the youngest age DedupCleanup deletes without
// Force. An inbox record younger than the longest time a message can still
// arrive again (broker redelivery, a relay repeating its unacknowledged
// tail, an operator's replay or failed retry) must stay: deleting it lets
// that duplicate through.
const DefaultDedupFloor = 7 * 24 * time.Hour

// DedupCleanupOptions selects the inbox records DedupCleanup removes.
type DedupCleanupOptions struct {
	// OlderThan: records processed more than this long ago go.
	OlderThan time.Duration
	// Consumer limits the cleanup to one consumer's records; nil means
	// every consumer's.
	Consumer *string
	// Floor is the youngest OlderThan accepted without Force; 0 means
	// DefaultDedupFloor, a negative value no floor.
	Floor time.Duration
	// Force accepts an OlderThan below Floor.
	Force  bool
	Batch  Batch
	DryRun bool
}

// DedupCleanup deletes rows of message_deduplication whose processed_at is
// more than OlderThan ago, in batches (see the package documentation). An
// OlderThan below the floor is refused (*RefusedError) unless Force is set.
func DedupCleanup(ctx context.Context, db *sql.DB, o DedupCleanupOptions) (DeleteResult, error) {
	floor := o.Floor
	if floor == 0 {
		floor = DefaultDedupFloor
	}
	if o.OlderThan < floor && !o.Force {
		return DeleteResult{}, refused("deleting inbox records younger than %s (the floor) is refused: a message redelivered or replayed after its record is gone is processed twice; choose an older age or force it",
			formatAge(floor))
	}
	size, err := o.Batch.size()
	if err != nil {
		return DeleteResult{}, err
	}
	cutoff, err := cutoffFor(ctx, db, o.OlderThan)
	if err != nil {
		return DeleteResult{}, fmt.Errorf("clean up %s: %w", DedupTable, err)
	}
	res := DeleteResult{Cutoff: cutoff}
	c := sqlTime(cutoff)
	filter, args := "", []any{}
	if o.Consumer != nil {
		filter = " AND consumer = ?"
		args = append(args, *o.Consumer)
	}
	if o.DryRun {
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+DedupTable+" WHERE processed_at < ?"+filter,
			append([]any{c}, args...)...).Scan(&res.Rows); err != nil {
			return res, fmt.Errorf("clean up %s: count records: %w", DedupTable, err)
		}
		return res, nil
	}

	// The cursor is a processed_at: each listing starts at the last one
	// seen (rows sharing it and not yet listed come next; the deleted ones
	// are gone), so the scan never walks back over what it deleted.
	del := "DELETE d FROM JSON_TABLE(?, '$[*]' COLUMNS (" +
		"consumer VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]', " +
		"mid CHAR(32) CHARACTER SET ascii PATH '$[1]')) AS k " +
		"STRAIGHT_JOIN " + DedupTable + " AS d FORCE INDEX (PRIMARY) " +
		"ON d.consumer = k.consumer AND d.message_id = UNHEX(k.mid) WHERE d.processed_at < ?"
	from := "0001-01-01 00:00:00.000000"
	for {
		keys, last, err := listDedup(ctx, db, from, c, filter, args, size)
		if err != nil {
			return res, fmt.Errorf("clean up %s (after %d deleted): list records: %w", DedupTable, res.Rows, err)
		}
		if len(keys) == 0 {
			return res, nil
		}
		doc, err := json.Marshal(keys)
		if err != nil {
			return res, fmt.Errorf("clean up %s: %w", DedupTable, err)
		}
		var n int64
		if err := inReadCommitted(ctx, db, func(tx *sql.Tx) error {
			r, err := tx.ExecContext(ctx, del, string(doc), c)
			if err != nil {
				return err
			}
			n, err = r.RowsAffected()
			return err
		}); err != nil {
			return res, fmt.Errorf("clean up %s (after %d deleted): delete %d records: %w", DedupTable, res.Rows, len(keys), err)
		}
		res.Rows += n
		res.Batches++
		if o.Batch.Progress != nil {
			o.Batch.Progress(res.Rows)
		}
		// n == 0: another cleanup deleted them first; it is doing the job.
		if len(keys) < size || n == 0 || !o.Batch.pause(ctx) {
			return res, ctx.Err()
		}
		from = sqlTime(last)
	}
}

// listDedup lists up to limit records processed at or after from and before
// cutoff, oldest first, as [consumer, hex message id] pairs, and the
// processed_at of the last.
func listDedup(ctx context.Context, db *sql.DB, from, cutoff, filter string, args []any, limit int) ([][2]string, time.Time, error) {
	rows, err := db.QueryContext(ctx, "SELECT consumer, message_id, processed_at FROM "+DedupTable+
		" WHERE processed_at >= ? AND processed_at < ?"+filter+" ORDER BY processed_at LIMIT ?",
		append(append([]any{from, cutoff}, args...), limit)...)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer rows.Close()
	var (
		keys []([2]string)
		last sqltime.UTC
	)
	for rows.Next() {
		var consumer string
		var id []byte
		if err := rows.Scan(&consumer, &id, &last); err != nil {
			return nil, time.Time{}, err
		}
		keys = append(keys, [2]string{consumer, hex.EncodeToString(id)})
	}
	return keys, last.T, rows.Err()
}

// formatAge prints whole days as "7d", anything else as a Go duration.
func formatAge(d time.Duration) string {
	const day = 24 * time.Hour
	if d > 0 && d%day == 0 {
		return fmt.Sprintf("%dd", d/day)
	}
	return d.String()
}
