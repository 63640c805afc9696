package dedup

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Headers the relay sets on every message (docs/wire.md).
const (
	headerOutboxID     = "x-outbox-id"
	headerPartitionKey = "x-partition-key"
	headerCreatedAt    = "x-created-at" // created_at, RFC 3339 UTC with microseconds
)

// Column limits of outbox_failed and message_inbox_attempts, in characters.
const (
	maxKeyLen         = 255   // partition_key, exchange, routing_key, message_type
	maxContentTypeLen = 100   // content_type
	maxLastErrorLen   = 1024  // last_error
	maxErrorLen       = 16384 // error (TEXT holds 65,535 bytes; keep well inside)
)

// datetimeLayout is how times are written: DATETIME(6) text, UTC.
const datetimeLayout = "2006-01-02 15:04:05.000000"

// countAttempt records one failed attempt of message id, in a transaction
// of its own, and returns how many there have been.
func countAttempt(ctx context.Context, db *sql.DB, consumer string, id outbox.MessageID, failure error) (int64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("dedup: consumer %q, message %s: count the attempt: begin: %w", consumer, id, err)
	}
	defer tx.Rollback()
	lastErr := truncate(failure.Error(), maxLastErrorLen)
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+AttemptsTable+
		` (consumer, message_id, attempts, last_error, updated_at) VALUES (?, ?, 1, ?, UTC_TIMESTAMP(6))
		ON DUPLICATE KEY UPDATE attempts = attempts + 1, last_error = ?, updated_at = UTC_TIMESTAMP(6)`,
		consumer, id[:], lastErr, lastErr); err != nil {
		return 0, fmt.Errorf("dedup: consumer %q, message %s: count the attempt: %w", consumer, id, err)
	}
	var n int64
	if err := tx.QueryRowContext(ctx, "SELECT attempts FROM "+AttemptsTable+" WHERE consumer = ? AND message_id = ?",
		consumer, id[:]).Scan(&n); err != nil {
		return 0, fmt.Errorf("dedup: consumer %q, message %s: read the attempts: %w", consumer, id, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("dedup: consumer %q, message %s: count the attempt: commit: %w", consumer, id, err)
	}
	return n, nil
}

// clearAttempts forgets the failed attempts of a message, in the
// transaction that processed it.
func clearAttempts(ctx context.Context, tx *sql.Tx, consumer string, id outbox.MessageID) error {
	if _, err := tx.ExecContext(ctx, "DELETE FROM "+AttemptsTable+" WHERE consumer = ? AND message_id = ?", consumer, id[:]); err != nil {
		return fmt.Errorf("dedup: clear the failed attempts: %w", err)
	}
	return nil
}

// giveUp copies d into outbox_failed with source 'inbox' and forgets its
// attempts, in one transaction, so a message sent again later (`failed
// retry`) starts with a full set of attempts. id is the zero id when d's
// message-id is not a UUID.
//
// A crash between this commit and the ack redelivers d: it is processed
// again and may fail its way into outbox_failed a second time. Both rows
// carry the same message_id, and the inbox deduplicates a retry of both.
func giveUp(ctx context.Context, db *sql.DB, consumer string, d amqp.Delivery, id outbox.MessageID, attempts int64, lastErr, reason string) error {
	row := failedRow(d, id, attempts, lastErr, reason)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("dedup: consumer %q, message %q: move to %s: begin: %w", consumer, d.MessageId, FailedTable, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+FailedTable+
		` (outbox_id, message_id, partition_key, exchange, routing_key, message_type, headers, payload,
		content_type, created_at, attempts, last_error, error, source, failed_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'inbox', UTC_TIMESTAMP(6))`, row...); err != nil {
		return fmt.Errorf("dedup: consumer %q, message %q: move to %s: %w", consumer, d.MessageId, FailedTable, err)
	}
	if id != (outbox.MessageID{}) {
		if err := clearAttempts(ctx, tx, consumer, id); err != nil {
			return fmt.Errorf("dedup: consumer %q, message %s: move to %s: %w", consumer, id, FailedTable, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("dedup: consumer %q, message %q: move to %s: commit: %w", consumer, d.MessageId, FailedTable, err)
	}
	return nil
}

// failedRow returns the values of an outbox_failed row for d, in the order
// giveUp inserts them: the outbox columns as the relay published them
// (docs/wire.md read backwards), then attempts, last_error and error.
func failedRow(d amqp.Delivery, id outbox.MessageID, attempts int64, lastErr, reason string) []any {
	var outboxID uint64
	switch v := d.Headers[headerOutboxID].(type) {
	case int64:
		if v > 0 {
			outboxID = uint64(v)
		}
	case int32:
		if v > 0 {
			outboxID = uint64(v)
		}
	}
	key, _ := d.Headers[headerPartitionKey].(string)
	payload := d.Body
	if payload == nil {
		payload = []byte{} // NOT NULL
	}
	var last any // NULL when there was no attempt
	if lastErr != "" {
		last = truncate(lastErr, maxLastErrorLen)
	}
	return []any{
		outboxID,
		id[:],
		truncate(key, maxKeyLen),
		truncate(d.Exchange, maxKeyLen),
		truncate(d.RoutingKey, maxKeyLen),
		truncate(d.Type, maxKeyLen),
		headersJSON(d.Headers),
		payload,
		truncate(d.ContentType, maxContentTypeLen),
		createdAt(d, time.Now()).Format(datetimeLayout),
		attempts,
		last,
		truncate(reason, maxErrorLen),
	}
}

// createdAt is the message's created_at: the x-created-at header (with its
// microseconds), else the AMQP timestamp (whole seconds), else now; always
// UTC and inside DATETIME's range.
func createdAt(d amqp.Delivery, now time.Time) time.Time {
	t := d.Timestamp
	if s, ok := d.Headers[headerCreatedAt].(string); ok {
		if p, err := time.Parse(time.RFC3339Nano, s); err == nil {
			t = p
		}
	}
	if t.IsZero() || t.Year() < 1000 || t.Year() > 9999 {
		t = now
	}
	return t.UTC()
}

// headersJSON returns d's headers as the JSON object the outbox's headers
// column holds, without the headers the relay adds (it sets them again if
// the message is retried), or nil (NULL) when none are left. Values that
// JSON has no form for become text: timestamps in RFC 3339, decimals in
// decimal notation, byte arrays as text when they are UTF-8.
func headersJSON(h amqp.Table) any {
	obj := map[string]any{}
	for k, v := range h {
		if relayHeader(k) {
			continue
		}
		obj[k] = jsonValue(v)
	}
	if len(obj) == 0 {
		return nil
	}
	b, err := json.Marshal(obj)
	if err != nil {
		// jsonValue leaves nothing json.Marshal refuses; keep the row
		// insertable whatever happens.
		return nil
	}
	return string(b)
}

// relayHeader reports whether the relay sets the header name (the outbox
// package refuses these from producers).
func relayHeader(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "x-outbox-") || strings.HasPrefix(n, "x-relay-") ||
		n == "x-partition-key" || n == "x-replay" || n == "x-created-at"
}

// jsonValue maps an AMQP field value onto what encoding/json writes.
func jsonValue(v any) any {
	switch v := v.(type) {
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return strconv.FormatFloat(v, 'g', -1, 64)
		}
		return v
	case float32:
		return jsonValue(float64(v))
	case string:
		return strings.ToValidUTF8(v, "\uFFFD")
	case []byte:
		if utf8.Valid(v) {
			return string(v)
		}
		return v // base64
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case amqp.Decimal:
		return decimalText(v)
	case amqp.Table:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[strings.ToValidUTF8(k, "\uFFFD")] = jsonValue(x)
		}
		return m
	case []any:
		a := make([]any, len(v))
		for i, x := range v {
			a[i] = jsonValue(x)
		}
		return a
	default: // nil, bool, integers
		return v
	}
}

// decimalText writes Value × 10^-Scale in decimal notation.
func decimalText(d amqp.Decimal) string {
	s := strconv.FormatInt(int64(d.Value), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	if scale := int(d.Scale); scale > 0 {
		if len(s) <= scale {
			s = strings.Repeat("0", scale-len(s)+1) + s
		}
		s = s[:len(s)-scale] + "." + s[len(s)-scale:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// truncate makes s valid UTF-8 of at most n characters.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i, count := 0, 0
	for i = range s {
		if count == n {
			break
		}
		count++
	}
	return s[:i]
}
