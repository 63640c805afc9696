package maintenance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// RetryOptions selects the failed messages Retry puts back into the outbox.
// A failure is named by its message id (a UUID: every failure of that
// message) or by its row id (outbox_failed.id: that failure alone). A
// failure whose message id was not a UUID (the inbox stores it as zeros)
// has only its row id.
type RetryOptions struct {
	// Table is the outbox table the messages go back to; "" means
	// outbox.DefaultTable. outbox_failed does not record which table a row
	// came from: with several outbox tables, name the message's.
	Table string
	// IDs are messages to retry by message id, RowIDs failures to retry by
	// row id; all of them in one transaction: if one cannot be retried,
	// none is. The zero message id is refused: it names no message.
	IDs    []outbox.MessageID
	RowIDs []uint64
	// All retries every failure in outbox_failed when Retry starts: each
	// message with a UUID once, each failure without one on its own;
	// oldest outbox id first, BatchSize messages per transaction. A
	// message that cannot be retried is skipped and the others go on.
	All bool
	// BatchSize is the messages per transaction with All; 0 means 100.
	BatchSize int
	// DryRun reports what would be retried and changes nothing.
	DryRun bool
}

// Retried is one message put back into the outbox.
type Retried struct {
	// MessageID is the message's id in the outbox: its own, or, when its
	// failure had no UUID (NewMessageID), a UUIDv7 made for the retry
	// (zero in a dry run).
	MessageID    outbox.MessageID
	NewMessageID bool
	// NewID is the outbox row's new id; 0 in a dry run.
	NewID uint64
	// RowIDs are the outbox_failed rows put back and deleted, in id order:
	// one, or every copy of a message that failed more than once.
	RowIDs []uint64
	// ReplacedDelivered: with --on-delivered=mark a failed row stays in the
	// outbox marked delivered; that copy was deleted to make room.
	ReplacedDelivered bool
}

// Skipped is a message or failure that was not retried, and why. RowID is
// set when it was named by row id (or has no UUID); MessageID is zero when
// it has no UUID or its row was not found.
type Skipped struct {
	MessageID outbox.MessageID
	RowID     uint64
	Reason    string
}

// Name is how the skipped message was named: its message id or its row id.
func (s Skipped) Name() string {
	if s.RowID != 0 {
		return fmt.Sprintf("failed row %d", s.RowID)
	}
	return s.MessageID.String()
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
// the failed rows it was rebuilt from deleted. Retry deletes no other
// failure: every row it deletes is put back.
//
// A message id names every failure of the message. They must be copies of
// one message (the same columns above; the inbox may record a message
// twice, the relay a message that failed again): the message goes back
// once and every copy is deleted. Failures under one id that differ are
// two messages a producer gave one id; only one of them can go back under
// it, so the id is refused: name the one to retry by its row id. A row id
// names that failure alone, leaving any other failure of its message.
//
// A failure without a UUID (zeros: the inbox got a message-id that was
// not one) goes back under a new UUIDv7, reported in Retried; it is
// named by row id only, and the zero message id is refused.
//
// The new row gets a new AUTO_INCREMENT id, so it is delivered after the
// rows of its partition key already in the outbox and before those enqueued
// after the retry commits. The message id is unchanged (but for failures
// without a UUID): inbox consumers that processed it before still skip it.
// created_at is the retry's time: the relay's lag and latency figures, the
// AMQP timestamp and the daily partition the row lands in all follow the
// retry, not the first attempt.
//
// A message with a pending row in the outbox (delivered_at IS NULL) is not
// retried: that row is still to be delivered, and a second one would be a
// duplicate. A copy marked delivered (mark mode keeps failed rows so) is
// deleted and replaced. A message or row not in outbox_failed (never
// failed, or retried or purged meanwhile) is not retried either. With IDs
// and RowIDs, any such message makes the whole call a *RefusedError that
// changes nothing; with All, such messages are skipped and Retry returns a
// *RefusedError naming how many after retrying the others.
func Retry(ctx context.Context, db *sql.DB, o RetryOptions) (RetryResult, error) {
	table, err := quoteOutbox(o.Table)
	if err != nil {
		return RetryResult{}, err
	}
	named := len(o.IDs) + len(o.RowIDs)
	switch {
	case o.All && named > 0:
		return RetryResult{}, refused("give message ids, row ids or all, not both")
	case !o.All && named == 0:
		return RetryResult{}, refused("no message to retry: give message ids, row ids or all")
	case o.All:
		return retryAll(ctx, db, table, o)
	}
	targets, err := namedTargets(o.IDs, o.RowIDs)
	if err != nil {
		return RetryResult{}, err
	}
	retried, skipped, err := retryBatch(ctx, db, table, targets, true, o.DryRun)
	res := RetryResult{Retried: retried, Skipped: skipped}
	switch {
	case err != nil:
		return res, err
	case len(skipped) > 0 && o.DryRun:
		return res, refused("%d of %d cannot be retried; the retry would change nothing", len(skipped), len(targets))
	case len(skipped) > 0:
		return res, refused("%d of %d cannot be retried; nothing was changed", len(skipped), len(targets))
	}
	return res, nil
}

// errZeroID refuses the zero message id.
func errZeroID() error {
	return refused("the zero message id %s names no message: %s holds it for failures whose message id was not a UUID; "+
		"name those by their row id (failed list shows it)", outbox.MessageID{}, FailedTable)
}

// target names failures: a message id (every failure of it) or a row id.
type target struct {
	msg outbox.MessageID
	row uint64
}

// splitTargets returns the message ids and the row ids targets name.
func splitTargets(targets []target) (msgs []outbox.MessageID, rows []uint64) {
	for _, t := range targets {
		if t.row != 0 {
			rows = append(rows, t.row)
		} else {
			msgs = append(msgs, t.msg)
		}
	}
	return msgs, rows
}

// namedTargets returns the ids given, each once, message ids first.
func namedTargets(ids []outbox.MessageID, rowIDs []uint64) ([]target, error) {
	var out []target
	seen := map[target]bool{}
	for _, id := range ids {
		if id == (outbox.MessageID{}) {
			return nil, errZeroID()
		}
		if t := (target{msg: id}); !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	for _, id := range rowIDs {
		if id == 0 {
			return nil, refused("row id 0 names no failure: %s row ids start at 1", FailedTable)
		}
		if t := (target{row: id}); !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out, nil
}

// retryAll retries every failure of outbox_failed in batches.
func retryAll(ctx context.Context, db *sql.DB, table string, o RetryOptions) (RetryResult, error) {
	var res RetryResult
	batch := o.BatchSize
	if batch <= 0 {
		batch = 100
	}
	all, err := failedTargets(ctx, db)
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

// failedTargets lists what outbox_failed holds, oldest outbox id first:
// each message with a UUID once, by message id; each failure without one
// by its row id.
func failedTargets(ctx context.Context, db *sql.DB) ([]target, error) {
	var zero outbox.MessageID
	rows, err := db.QueryContext(ctx, "SELECT message_id, IF(message_id = ?, id, 0) AS row_ref FROM "+FailedTable+
		" GROUP BY message_id, row_ref ORDER BY MIN(outbox_id), MIN(id)", zero[:])
	if err != nil {
		return nil, fmt.Errorf("list failed messages: %w", err)
	}
	defer rows.Close()
	var out []target
	for rows.Next() {
		var raw []byte
		var t target
		if err := rows.Scan(&raw, &t.row); err != nil {
			return nil, fmt.Errorf("list failed messages: %w", err)
		}
		if t.row == 0 {
			copy(t.msg[:], raw)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list failed messages: %w", err)
	}
	return out, nil
}

// retryBatch retries targets in one transaction (in a dry run: only
// reads). strict: anything that cannot be retried rolls everything back.
func retryBatch(ctx context.Context, db *sql.DB, table string, targets []target, strict, dryRun bool) ([]Retried, []Skipped, error) {
	var plan retryPlan
	if dryRun {
		p, err := planRetry(ctx, db, table, targets, false)
		if err != nil {
			return nil, nil, fmt.Errorf("retry %d messages (dry run): %w", len(targets), err)
		}
		if strict && len(p.skipped) > 0 {
			return nil, p.skipped, nil
		}
		return p.retried, p.skipped, nil
	}
	errSkipped := errors.New("skipped")
	err := inReadCommitted(ctx, db, func(tx *sql.Tx) error {
		var err error
		if plan, err = planRetry(ctx, tx, table, targets, true); err != nil {
			return err
		}
		if strict && len(plan.skipped) > 0 {
			return errSkipped // roll back: all or nothing
		}
		return plan.apply(ctx, tx, table)
	})
	switch {
	case errors.Is(err, errSkipped):
		return nil, plan.skipped, nil
	case err != nil:
		return nil, nil, fmt.Errorf("retry %d messages: %w", len(targets), err)
	}
	return plan.retried, plan.skipped, nil
}
