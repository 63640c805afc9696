package maintenance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// RetryOptions selects the failed messages Retry puts back into the outbox.
type RetryOptions struct {
	// Table is the outbox table the messages go back to; "" means
	// outbox.DefaultTable. outbox_failed does not record which table a row
	// came from: with several outbox tables, name the message's.
	Table string
	// IDs are the messages to retry, all in one transaction: if one of them
	// cannot be retried, none is.
	IDs []outbox.MessageID
	// All retries every message in outbox_failed when Retry starts, oldest
	// outbox id first, BatchSize messages per transaction. A message that
	// cannot be retried is skipped and the others go on.
	All bool
	// BatchSize is the messages per transaction with All; 0 means 100.
	BatchSize int
	// DryRun reports what would be retried and changes nothing.
	DryRun bool
}

// Retried is one message put back into the outbox.
type Retried struct {
	MessageID outbox.MessageID
	// NewID is the outbox row's new id; 0 in a dry run.
	NewID uint64
	// FailedRows is how many outbox_failed rows of the message were
	// deleted (a message may have failed more than once).
	FailedRows int
	// ReplacedDelivered: with --on-delivered=mark a failed row stays in the
	// outbox marked delivered; that copy was deleted to make room.
	ReplacedDelivered bool
}

// Skipped is a message that was not retried, and why.
type Skipped struct {
	MessageID outbox.MessageID
	Reason    string
}

// RetryResult is what Retry did, or in a dry run would do.
type RetryResult struct {
	Retried []Retried
	Skipped []Skipped
}

// Retry puts failed messages back into the outbox for the relay to publish
// again. For each message, in one transaction with its peers: a new outbox
// row with the same message_id, partition_key, exchange, routing_key,
// message_type, headers, payload and content_type as its newest failed row
// (created_at the time of the retry, available_at NULL, attempts 0), and
// every outbox_failed row of the message deleted.
//
// The new row gets a new AUTO_INCREMENT id, so it is delivered after the
// rows of its partition key already in the outbox and before those enqueued
// after the retry commits. The message id is unchanged: inbox consumers
// that processed it before still skip it. created_at is the retry's time:
// the relay's lag and latency figures, the AMQP timestamp and the daily
// partition the row lands in all follow the retry, not the first attempt.
//
// A message with a pending row in the outbox (delivered_at IS NULL) is not
// retried: that row is still to be delivered, and a second one would be a
// duplicate. A copy marked delivered (mark mode keeps failed rows so) is
// deleted and replaced. A message not in outbox_failed (never failed, or
// retried or purged meanwhile) is not retried either. With IDs, any such
// message makes the whole call a *RefusedError that changes nothing; with
// All, such messages are skipped and Retry returns a *RefusedError naming
// how many after retrying the others.
func Retry(ctx context.Context, db *sql.DB, o RetryOptions) (RetryResult, error) {
	table, err := quoteOutbox(o.Table)
	if err != nil {
		return RetryResult{}, err
	}
	var res RetryResult
	switch {
	case o.All && len(o.IDs) > 0:
		return res, refused("give message ids or all, not both")
	case !o.All && len(o.IDs) == 0:
		return res, refused("no message to retry: give message ids or all")
	case !o.All:
		ids := dedupIDs(o.IDs)
		retried, skipped, err := retryBatch(ctx, db, table, ids, true, o.DryRun)
		if err != nil {
			return res, err
		}
		res.Retried, res.Skipped = retried, skipped
		if len(skipped) > 0 {
			if o.DryRun {
				return res, refused("%d of %d messages cannot be retried; the retry would change nothing", len(skipped), len(ids))
			}
			return res, refused("%d of %d messages cannot be retried; nothing was changed", len(skipped), len(ids))
		}
		return res, nil
	}

	batch := o.BatchSize
	if batch <= 0 {
		batch = 100
	}
	all, err := failedMessages(ctx, db)
	if err != nil {
		return res, err
	}
	for len(all) > 0 {
		n := min(batch, len(all))
		retried, skipped, err := retryBatch(ctx, db, table, all[:n], false, o.DryRun)
		if err != nil {
			return res, fmt.Errorf("after %d retried: %w", len(res.Retried), err)
		}
		res.Retried = append(res.Retried, retried...)
		res.Skipped = append(res.Skipped, skipped...)
		all = all[n:]
	}
	if len(res.Skipped) > 0 {
		return res, refused("%d messages cannot be retried and stay in %s", len(res.Skipped), FailedTable)
	}
	return res, nil
}

// failedMessages lists the distinct messages of outbox_failed, oldest
// outbox id first.
func failedMessages(ctx context.Context, db *sql.DB) ([]outbox.MessageID, error) {
	rows, err := db.QueryContext(ctx, "SELECT message_id FROM "+FailedTable+
		" GROUP BY message_id ORDER BY MIN(outbox_id), MIN(id)")
	if err != nil {
		return nil, fmt.Errorf("list failed messages: %w", err)
	}
	defer rows.Close()
	var ids []outbox.MessageID
	for rows.Next() {
		var raw []byte
		if err := rows.Scan(&raw); err != nil {
			return nil, fmt.Errorf("list failed messages: %w", err)
		}
		var id outbox.MessageID
		copy(id[:], raw)
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list failed messages: %w", err)
	}
	return ids, nil
}

func dedupIDs(ids []outbox.MessageID) []outbox.MessageID {
	seen := make(map[outbox.MessageID]bool, len(ids))
	out := make([]outbox.MessageID, 0, len(ids))
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// queryer is *sql.DB or *sql.Tx.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// failedRows is what one message has in outbox_failed.
type failedRows struct {
	rowIDs []uint64 // every row, in id order
	newest uint64   // the row the message is rebuilt from
}

// copyRow is a row of the outbox holding a message being retried.
type copyRow struct {
	id        uint64
	delivered bool
}

// retryBatch retries ids in one transaction (in a dry run: only reads).
// strict: any message that cannot be retried rolls everything back.
func retryBatch(ctx context.Context, db *sql.DB, table string, ids []outbox.MessageID, strict, dryRun bool) ([]Retried, []Skipped, error) {
	var (
		retried []Retried
		skipped []Skipped
	)
	work := func(q queryer, tx *sql.Tx) error {
		retried, skipped = nil, nil
		lock := ""
		if tx != nil {
			lock = " FOR UPDATE" // a concurrent retry of the same message waits, then finds nothing
		}
		failed := map[outbox.MessageID]*failedRows{}
		err := queryByMessageID(ctx, q, "SELECT message_id, id FROM "+FailedTable+" WHERE message_id IN (%s) ORDER BY id"+lock, ids,
			func(rows *sql.Rows) error {
				var mid outbox.MessageID
				var raw []byte
				var id uint64
				if err := rows.Scan(&raw, &id); err != nil {
					return err
				}
				copy(mid[:], raw)
				f := failed[mid]
				if f == nil {
					f = &failedRows{}
					failed[mid] = f
				}
				f.rowIDs = append(f.rowIDs, id)
				f.newest = id
				return nil
			})
		if err != nil {
			return fmt.Errorf("read %s: %w", FailedTable, err)
		}
		copies := map[outbox.MessageID][]copyRow{}
		err = queryByMessageID(ctx, q, "SELECT message_id, id, delivered_at IS NOT NULL FROM "+table+" WHERE message_id IN (%s)", ids,
			func(rows *sql.Rows) error {
				var mid outbox.MessageID
				var raw []byte
				var c copyRow
				if err := rows.Scan(&raw, &c.id, &c.delivered); err != nil {
					return err
				}
				copy(mid[:], raw)
				copies[mid] = append(copies[mid], c)
				return nil
			})
		if err != nil {
			return fmt.Errorf("look the messages up in %s: %w", table, err)
		}

		var (
			take        []outbox.MessageID
			newest      []uint64
			failedIDs   []uint64
			deliveredID []uint64
		)
		for _, id := range ids {
			f := failed[id]
			if f == nil {
				skipped = append(skipped, Skipped{id, "not in " + FailedTable + " (never failed, or already retried or purged)"})
				continue
			}
			r := Retried{MessageID: id, FailedRows: len(f.rowIDs)}
			pending := false
			for _, c := range copies[id] {
				if !c.delivered {
					skipped = append(skipped, Skipped{id, fmt.Sprintf("still pending in %s as id %d: it will be delivered from there", strings.Trim(table, "`"), c.id)})
					pending = true
					break
				}
				r.ReplacedDelivered = true
			}
			if pending {
				continue
			}
			for _, c := range copies[id] {
				deliveredID = append(deliveredID, c.id)
			}
			take = append(take, id)
			newest = append(newest, f.newest)
			failedIDs = append(failedIDs, f.rowIDs...)
			retried = append(retried, r)
		}
		if tx == nil || len(take) == 0 || (strict && len(skipped) > 0) {
			return nil
		}

		if len(deliveredID) > 0 {
			if _, err := tx.ExecContext(ctx, "DELETE o FROM "+idRows(deliveredID, "k")+" STRAIGHT_JOIN "+table+
				" AS o ON o.id = k.id WHERE o.delivered_at IS NOT NULL"); err != nil {
				return fmt.Errorf("delete %d delivered copies from %s: %w", len(deliveredID), table, err)
			}
		}
		// In the messages' original order, so two retried messages of one
		// partition key keep theirs.
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+table+
			" (message_id, partition_key, exchange, routing_key, message_type, headers, payload, content_type, created_at)"+
			" SELECT f.message_id, f.partition_key, f.exchange, f.routing_key, f.message_type, f.headers, f.payload, f.content_type, UTC_TIMESTAMP(6)"+
			" FROM "+idRows(newest, "k")+" STRAIGHT_JOIN "+FailedTable+" AS f ON f.id = k.id ORDER BY f.outbox_id, f.id"); err != nil {
			var me *mysql.MySQLError
			if errors.As(err, &me) && me.Number == 1062 {
				return fmt.Errorf("insert %d messages into %s: one of them was inserted there meanwhile (%w); run the retry again to see which", len(take), table, err)
			}
			return fmt.Errorf("insert %d messages into %s: %w", len(take), table, err)
		}
		newIDs := map[outbox.MessageID]uint64{}
		err = queryByMessageID(ctx, tx, "SELECT message_id, id FROM "+table+" WHERE message_id IN (%s) AND delivered_at IS NULL", take,
			func(rows *sql.Rows) error {
				var mid outbox.MessageID
				var raw []byte
				var id uint64
				if err := rows.Scan(&raw, &id); err != nil {
					return err
				}
				copy(mid[:], raw)
				newIDs[mid] = id
				return nil
			})
		if err != nil {
			return fmt.Errorf("read the new ids in %s: %w", table, err)
		}
		for i := range retried {
			retried[i].NewID = newIDs[retried[i].MessageID]
		}
		if _, err := tx.ExecContext(ctx, "DELETE f FROM "+idRows(failedIDs, "k")+" STRAIGHT_JOIN "+FailedTable+
			" AS f ON f.id = k.id"); err != nil {
			return fmt.Errorf("delete %d rows of %s: %w", len(failedIDs), FailedTable, err)
		}
		return nil
	}

	if dryRun {
		if err := work(db, nil); err != nil {
			return nil, nil, fmt.Errorf("retry %d messages (dry run): %w", len(ids), err)
		}
		if strict && len(skipped) > 0 {
			return nil, skipped, nil
		}
		return retried, skipped, nil
	}
	errSkipped := errors.New("skipped")
	err := inReadCommitted(ctx, db, func(tx *sql.Tx) error {
		if err := work(tx, tx); err != nil {
			return err
		}
		if strict && len(skipped) > 0 {
			return errSkipped // roll back: all or nothing
		}
		return nil
	})
	switch {
	case errors.Is(err, errSkipped):
		return nil, skipped, nil
	case err != nil:
		return nil, nil, fmt.Errorf("retry %d messages: %w", len(ids), err)
	}
	return retried, skipped, nil
}

// queryByMessageID runs query (with one %s for a placeholder list) over ids
// in chunks of at most 500, calling scan for each row.
func queryByMessageID(ctx context.Context, q queryer, query string, ids []outbox.MessageID, scan func(*sql.Rows) error) error {
	for rest := ids; len(rest) > 0; {
		n := min(len(rest), 500)
		args := make([]any, n)
		for i := range rest[:n] {
			args[i] = rest[i][:]
		}
		if err := func() error {
			rows, err := q.QueryContext(ctx, fmt.Sprintf(query, "?"+strings.Repeat(",?", n-1)), args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				if err := scan(rows); err != nil {
					return err
				}
			}
			return rows.Err()
		}(); err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}
