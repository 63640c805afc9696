package maintenance

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// CleanupOptions selects the delivered rows CleanupDelivered removes.
type CleanupOptions struct {
	// Table is the outbox table; "" means outbox.DefaultTable.
	Table string
	// OlderThan: rows whose delivered_at is more than this long ago go.
	OlderThan time.Duration
	Batch     Batch
	// DryRun counts the rows that qualify and deletes nothing.
	DryRun bool
}

// CleanupDelivered deletes the outbox rows the relay marked delivered
// (--on-delivered=mark) more than OlderThan ago. Pending rows
// (delivered_at IS NULL) are never touched; in delete mode there are no
// marked rows and it does nothing.
//
// It walks the table in primary-key order once: a non-locking read lists
// the next Batch.Size qualifying ids, one READ COMMITTED transaction deletes
// exactly those (by primary key, re-checking delivered_at). Rows deleted
// before an error stay deleted; running it again finishes the job.
func CleanupDelivered(ctx context.Context, db *sql.DB, o CleanupOptions) (DeleteResult, error) {
	table, err := quoteOutbox(o.Table)
	if err != nil {
		return DeleteResult{}, err
	}
	if _, err := o.Batch.size(); err != nil {
		return DeleteResult{}, err
	}
	cutoff, err := cutoffFor(ctx, db, o.OlderThan)
	if err != nil {
		return DeleteResult{}, fmt.Errorf("clean up %s: %w", table, err)
	}
	res := DeleteResult{Cutoff: cutoff}
	c := sqlTime(cutoff)
	if o.DryRun {
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table+
			" WHERE delivered_at IS NOT NULL AND delivered_at < ?", c).Scan(&res.Rows); err != nil {
			return res, fmt.Errorf("clean up %s: count delivered rows: %w", table, err)
		}
		return res, nil
	}
	list := func(cursor uint64, limit int) ([]uint64, error) {
		return scanIDs(ctx, db, "SELECT id FROM "+table+
			" WHERE id > ? AND delivered_at IS NOT NULL AND delivered_at < ? ORDER BY id LIMIT ?", cursor, c, limit)
	}
	res.Rows, res.Batches, err = deleteByID(ctx, db, table, o.Batch,
		"o.delivered_at IS NOT NULL AND o.delivered_at < ?", []any{c}, list)
	if err != nil {
		return res, fmt.Errorf("clean up delivered rows of %s (after %d deleted): %w", table, res.Rows, err)
	}
	return res, nil
}

// quoteOutbox checks and quotes an outbox table name ("" is the default).
func quoteOutbox(name string) (string, error) {
	if name == "" {
		name = outbox.DefaultTable
	}
	q, err := outbox.QuoteTable(name)
	if err != nil {
		return "", &RefusedError{Reason: err.Error()}
	}
	return q, nil
}
