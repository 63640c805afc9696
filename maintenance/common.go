package maintenance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Tables the jobs work on besides the outbox table (their names are fixed:
// every outbox table of a database shares them).
const (
	FailedTable = "outbox_failed"
	DedupTable  = "message_deduplication"
)

// RefusedError is a request the package will not carry out as asked; the
// message says why and what to do instead. The CLI exits 2 on it.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return e.Reason }

func refused(format string, args ...any) error {
	return &RefusedError{Reason: fmt.Sprintf(format, args...)}
}

// IsRefused reports whether err is (or wraps) a *RefusedError.
func IsRefused(err error) bool {
	var r *RefusedError
	return errors.As(err, &r)
}

// Batch bounds the work of one delete transaction.
type Batch struct {
	// Size is the most rows one transaction deletes; 0 means
	// DefaultBatchSize. At most MaxBatchSize.
	Size int
	// Pause is waited between batches (0: none), to give replicas time to
	// apply each batch before the next.
	Pause time.Duration
	// Progress, if set, is called after each batch with the rows deleted
	// so far.
	Progress func(deleted int64)
}

// Batch size limits.
const (
	DefaultBatchSize = 1000
	MaxBatchSize     = 10000
)

func (b Batch) size() (int, error) {
	switch {
	case b.Size == 0:
		return DefaultBatchSize, nil
	case b.Size < 0 || b.Size > MaxBatchSize:
		return 0, refused("batch size %d: want 1 to %d", b.Size, MaxBatchSize)
	}
	return b.Size, nil
}

// pause waits b.Pause between batches; false when ctx ended.
func (b Batch) pause(ctx context.Context) bool {
	if b.Pause <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(b.Pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// DeleteResult is what a batched delete did (or, in a dry run, would do).
type DeleteResult struct {
	Cutoff  time.Time // rows older than this (UTC) qualify
	Rows    int64     // rows deleted; in a dry run, rows that qualify
	Batches int       // delete transactions committed
}

// datetimeLayout is how DATETIME(6) values travel as text, in UTC.
const datetimeLayout = "2006-01-02 15:04:05.000000"

// cutoffFor returns the server's UTC_TIMESTAMP(6) minus age.
func cutoffFor(ctx context.Context, db *sql.DB, age time.Duration) (time.Time, error) {
	if age < 0 {
		return time.Time{}, refused("age %s is negative", age)
	}
	var s string
	if err := db.QueryRowContext(ctx,
		"SELECT DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, '%Y-%m-%d %H:%i:%s.%f')",
		age.Microseconds()).Scan(&s); err != nil {
		return time.Time{}, fmt.Errorf("read the server's time: %w", err)
	}
	t, err := time.ParseInLocation(datetimeLayout, s, time.UTC)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the server's time: %q: %w", s, err)
	}
	return t, nil
}

// sqlTime is t as a DATETIME(6) literal's text, for a placeholder: the
// same whatever the pool's parseTime and loc settings.
func sqlTime(t time.Time) string { return t.UTC().Format(datetimeLayout) }

// idRows is a row source of the given ids for a STRAIGHT_JOIN to a table
// by primary key: a point lookup per id, whatever the table's statistics
// say (checkpoint.AckRows explains why the plain IN and BETWEEN forms are
// not safe on a queue table). The ids are integers, inlined.
func idRows(ids []uint64, alias string) string {
	var b strings.Builder
	b.WriteString("JSON_TABLE('[")
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(id, 10))
	}
	b.WriteString("]', '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS " + alias)
	return b.String()
}

// scanIDs runs a query returning one BIGINT UNSIGNED column.
func scanIDs(ctx context.Context, db *sql.DB, query string, args ...any) ([]uint64, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []uint64
	for rows.Next() {
		var id uint64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// inReadCommitted runs f in one READ COMMITTED transaction and commits it.
func inReadCommitted(ctx context.Context, db *sql.DB, f func(tx *sql.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err := f(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// deleteByID deletes the rows of table (quoted) whose ids are listed and
// that still meet cond (a condition on alias o, with args), in batches
// listed by list: list(cursor, limit) returns the next ids after cursor in
// id order. Each batch is one READ COMMITTED transaction.
func deleteByID(ctx context.Context, db *sql.DB, table string, b Batch, cond string, args []any,
	list func(cursor uint64, limit int) ([]uint64, error)) (rows int64, batches int, err error) {
	size, err := b.size()
	if err != nil {
		return 0, 0, err
	}
	var cursor uint64
	for {
		ids, err := list(cursor, size)
		if err != nil {
			return rows, batches, fmt.Errorf("list rows after id %d: %w", cursor, err)
		}
		if len(ids) == 0 {
			return rows, batches, nil
		}
		q := "DELETE o FROM " + idRows(ids, "k") + " STRAIGHT_JOIN " + table + " AS o ON o.id = k.id WHERE " + cond
		var n int64
		if err := inReadCommitted(ctx, db, func(tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, q, args...)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		}); err != nil {
			return rows, batches, fmt.Errorf("delete %d rows from id %d to %d: %w", len(ids), ids[0], ids[len(ids)-1], err)
		}
		rows += n
		batches++
		if b.Progress != nil {
			b.Progress(rows)
		}
		cursor = ids[len(ids)-1]
		if len(ids) < size || !b.pause(ctx) {
			return rows, batches, ctx.Err()
		}
	}
}
