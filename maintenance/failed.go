package maintenance

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/sqltime"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// Failed is one row of outbox_failed: a message the relay or an inbox
// consumer gave up on. MessageID is zero when the message's id was not a
// UUID (the inbox records such messages so): RowID is then its only name.
type Failed struct {
	RowID        uint64 // outbox_failed.id
	OutboxID     uint64 // the outbox row's id when it failed
	MessageID    outbox.MessageID
	PartitionKey string
	Exchange     string
	RoutingKey   string
	MessageType  string
	ContentType  string
	Headers      []byte // the JSON text; nil when NULL
	Payload      []byte // nil in a list (PayloadBytes has its size)
	PayloadBytes int64
	CreatedAt    time.Time // UTC
	Attempts     uint32
	Error        string
	Source       string    // "relay" or "inbox"
	FailedAt     time.Time // UTC
}

// Source values of outbox_failed.
const (
	SourceRelay = "relay"
	SourceInbox = "inbox"
)

// ListOptions selects what ListFailed returns.
type ListOptions struct {
	// Limit is the most rows returned; 0 means 50.
	Limit int
	// Source keeps only rows of that source ("relay" or "inbox"); "" keeps
	// all.
	Source string
}

const failedColumns = "id, outbox_id, message_id, partition_key, exchange, routing_key, message_type, content_type, " +
	"headers, LENGTH(payload), created_at, attempts, error, source, failed_at"

// ListFailed returns the newest failed rows first, without their payloads,
// and how many rows match in all.
func ListFailed(ctx context.Context, db *sql.DB, o ListOptions) ([]Failed, int64, error) {
	limit := o.Limit
	if limit == 0 {
		limit = 50
	}
	if limit < 0 {
		return nil, 0, refused("limit %d is negative", limit)
	}
	where, args := "", []any{}
	switch o.Source {
	case "":
	case SourceRelay, SourceInbox:
		where, args = " WHERE source = ?", append(args, o.Source)
	default:
		return nil, 0, refused("source %q: want %q or %q", o.Source, SourceRelay, SourceInbox)
	}
	var total int64
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+FailedTable+where, args...).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("count failed messages: %w", err)
	}
	list, err := queryFailed(ctx, db, "SELECT "+failedColumns+" FROM "+FailedTable+where+
		" ORDER BY failed_at DESC, id DESC LIMIT ?", false, append(args, limit)...)
	if err != nil {
		return nil, 0, fmt.Errorf("list failed messages: %w", err)
	}
	return list, total, nil
}

// ShowFailed returns every failed row of one message (a message may have
// failed more than once, or in the relay and in an inbox), oldest first,
// with payloads. None is a *RefusedError, and so is the zero id: it stands
// for message ids that were not UUIDs, whose failures ShowFailedRow shows.
func ShowFailed(ctx context.Context, db *sql.DB, id outbox.MessageID) ([]Failed, error) {
	if id == (outbox.MessageID{}) {
		return nil, errZeroID()
	}
	list, err := queryFailed(ctx, db, "SELECT "+failedColumns+", payload FROM "+FailedTable+
		" WHERE message_id = ? ORDER BY failed_at, id", true, id[:])
	if err != nil {
		return nil, fmt.Errorf("read failed message %s: %w", id, err)
	}
	if len(list) == 0 {
		return nil, refused("message %s is not in %s", id, FailedTable)
	}
	return list, nil
}

// ShowFailedRow returns one failed row, by its id (outbox_failed.id), with
// its payload. A row that is not there is a *RefusedError.
func ShowFailedRow(ctx context.Context, db *sql.DB, rowID uint64) (Failed, error) {
	list, err := queryFailed(ctx, db, "SELECT "+failedColumns+", payload FROM "+FailedTable+" WHERE id = ?", true, rowID)
	if err != nil {
		return Failed{}, fmt.Errorf("read failed row %d: %w", rowID, err)
	}
	if len(list) == 0 {
		return Failed{}, refused("row %d is not in %s (retried or purged, or never there)", rowID, FailedTable)
	}
	return list[0], nil
}

func queryFailed(ctx context.Context, db queryer, query string, withPayload bool, args ...any) ([]Failed, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Failed
	for rows.Next() {
		var (
			f                 Failed
			mid               []byte
			headers           []byte
			created, failedAt sqltime.UTC
		)
		dest := []any{&f.RowID, &f.OutboxID, &mid, &f.PartitionKey, &f.Exchange, &f.RoutingKey, &f.MessageType,
			&f.ContentType, &headers, &f.PayloadBytes, &created, &f.Attempts, &f.Error, &f.Source, &failedAt}
		if withPayload {
			dest = append(dest, &f.Payload)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if len(mid) != len(f.MessageID) {
			return nil, fmt.Errorf("%s row %d: message_id is %d bytes, want %d", FailedTable, f.RowID, len(mid), len(f.MessageID))
		}
		copy(f.MessageID[:], mid)
		f.Headers = headers
		if withPayload && f.Payload == nil {
			f.Payload = []byte{}
		}
		f.CreatedAt, f.FailedAt = created.T, failedAt.T
		out = append(out, f)
	}
	return out, rows.Err()
}

// PurgeOptions selects the failed rows PurgeFailed removes.
type PurgeOptions struct {
	// OlderThan: rows whose failed_at is more than this long ago go.
	OlderThan time.Duration
	Batch     Batch
	// DryRun counts the rows that qualify and deletes nothing.
	DryRun bool
}

// PurgeFailed deletes the rows of outbox_failed that failed more than
// OlderThan ago, in batches. Their messages are gone for good: retry first
// what should still be delivered.
func PurgeFailed(ctx context.Context, db *sql.DB, o PurgeOptions) (DeleteResult, error) {
	if _, err := o.Batch.size(); err != nil {
		return DeleteResult{}, err
	}
	cutoff, err := cutoffFor(ctx, db, o.OlderThan)
	if err != nil {
		return DeleteResult{}, fmt.Errorf("purge %s: %w", FailedTable, err)
	}
	res := DeleteResult{Cutoff: cutoff}
	c := sqlTime(cutoff)
	if o.DryRun {
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+FailedTable+" WHERE failed_at < ?", c).Scan(&res.Rows); err != nil {
			return res, fmt.Errorf("purge %s: count rows: %w", FailedTable, err)
		}
		return res, nil
	}
	list := func(cursor uint64, limit int) ([]uint64, error) {
		return scanIDs(ctx, db, "SELECT id FROM "+FailedTable+" WHERE id > ? AND failed_at < ? ORDER BY id LIMIT ?", cursor, c, limit)
	}
	res.Rows, res.Batches, err = deleteByID(ctx, db, FailedTable, o.Batch, "o.failed_at < ?", []any{c}, list)
	if err != nil {
		return res, fmt.Errorf("purge %s (after %d deleted): %w", FailedTable, res.Rows, err)
	}
	return res, nil
}

// PurgeIDsOptions names the failures PurgeFailedIDs removes, as RetryOptions
// does: a message id names every failure of the message, a row id that
// failure alone.
type PurgeIDsOptions struct {
	IDs    []outbox.MessageID
	RowIDs []uint64
	// DryRun lists the rows that would go and deletes nothing.
	DryRun bool
}

// PurgeFailedIDs deletes the failures named, in one transaction, and
// returns them (without payloads), in id order. It deletes no other row. A
// name that matches nothing (retried or purged meanwhile, a typo) makes the
// whole call a *RefusedError that deletes nothing; so does the zero
// message id, which names no message.
func PurgeFailedIDs(ctx context.Context, db *sql.DB, o PurgeIDsOptions) ([]Failed, error) {
	targets, err := namedTargets(o.IDs, o.RowIDs)
	if err != nil {
		return nil, err
	}
	if len(targets) == 0 {
		return nil, refused("no failure to purge: give message ids or row ids")
	}
	var list []Failed
	purge := func(q queryer, tx *sql.Tx) error {
		var err error
		if list, err = failuresNamed(ctx, q, targets, tx != nil); err != nil {
			return err
		}
		if tx == nil {
			return nil
		}
		ids := make([]uint64, len(list))
		for i, f := range list {
			ids[i] = f.RowID
		}
		if _, err := tx.ExecContext(ctx, "DELETE f FROM "+idRows(ids, "k")+" STRAIGHT_JOIN "+FailedTable+" AS f ON f.id = k.id"); err != nil {
			return fmt.Errorf("delete %d rows: %w", len(ids), err)
		}
		return nil
	}
	if o.DryRun {
		err = purge(db, nil)
	} else {
		err = inReadCommitted(ctx, db, func(tx *sql.Tx) error { return purge(tx, tx) })
	}
	if err != nil && !IsRefused(err) {
		return nil, fmt.Errorf("purge %d named failures from %s: %w", len(targets), FailedTable, err)
	}
	return list, err
}

// failuresNamed reads the rows targets name, in id order (locking them
// when lock); a target naming nothing is a *RefusedError.
func failuresNamed(ctx context.Context, q queryer, targets []target, lock bool) ([]Failed, error) {
	msgs, rows := splitTargets(targets)
	suffix := " ORDER BY id"
	if lock {
		suffix += " FOR UPDATE"
	}
	// Two queries, each on its index: an OR of both would scan the table.
	var list []Failed
	for _, by := range []struct {
		column string
		args   []any
	}{{"message_id", anySlice(msgs, func(m outbox.MessageID) any { return m[:] })}, {"id", anySlice(rows, func(r uint64) any { return r })}} {
		if len(by.args) == 0 {
			continue
		}
		part, err := queryFailed(ctx, q, "SELECT "+failedColumns+" FROM "+FailedTable+" WHERE "+by.column+
			" IN (?"+strings.Repeat(",?", len(by.args)-1)+")"+suffix, false, by.args...)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", FailedTable, err)
		}
		for _, f := range part {
			if !slices.ContainsFunc(list, func(g Failed) bool { return g.RowID == f.RowID }) {
				list = append(list, f)
			}
		}
	}
	slices.SortFunc(list, func(a, b Failed) int { return cmp.Compare(a.RowID, b.RowID) })
	for _, t := range targets {
		if !slices.ContainsFunc(list, func(f Failed) bool { return (t.row != 0 && f.RowID == t.row) || (t.row == 0 && f.MessageID == t.msg) }) {
			name := t.msg.String()
			if t.row != 0 {
				name = fmt.Sprintf("row %d", t.row)
			}
			return nil, refused("%s is not in %s (retried or purged, or never there); nothing was purged", name, FailedTable)
		}
	}
	return list, nil
}

func anySlice[T any](s []T, f func(T) any) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = f(v)
	}
	return out
}
