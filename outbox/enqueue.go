package outbox

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/propagation"
)

// Statement size limits for one INSERT.
const (
	// DefaultMaxStatementBytes bounds the approximate size of one INSERT.
	// MariaDB's default max_allowed_packet is 16 MiB (MySQL 8.0: 64 MiB), and
	// with the driver's interpolateParams a binary payload may double when
	// escaped; 4 MiB stays clear of both.
	DefaultMaxStatementBytes = 4 << 20
	// maxRowsPerStatement keeps the placeholder count (9 per row) under the
	// protocol's limit of 65,535 parameters per prepared statement.
	maxRowsPerStatement = 5000
)

// Writer enqueues into a table other than "outbox". The zero value writes to
// DefaultTable.
type Writer struct {
	// Table is the outbox table's name: 1 to 64 characters out of
	// [A-Za-z0-9_$], quoted with backticks in the SQL. "" means DefaultTable.
	Table string
	// MaxStatementBytes bounds the approximate size of one INSERT; a call
	// whose messages add up to more is split into several INSERTs. 0 means
	// DefaultMaxStatementBytes. Raise it (up to about half the server's
	// max_allowed_packet) if you enqueue many large messages per call and
	// want them in one statement.
	MaxStatementBytes int
	// Propagator writes the trace context of Enqueue's ctx into every
	// message's Headers. nil means DefaultPropagator(): W3C Trace Context
	// (the headers traceparent and tracestate) and W3C Baggage (baggage).
	// Nothing is added when ctx carries no valid span context, and a header
	// the message sets itself (an explicit traceparent, say) is kept.
	Propagator propagation.TextMapPropagator
	// NoTracePropagation, when true, adds no trace context to the messages.
	NoTracePropagation bool
}

// Enqueue inserts msgs into the "outbox" table with ex, which should be the
// *sql.Tx of the business transaction; see [Writer.Enqueue].
func Enqueue(ctx context.Context, ex Execer, msgs ...Message) ([]MessageID, error) {
	return Writer{}.Enqueue(ctx, ex, msgs...)
}

// Enqueue validates every message, then inserts them all with one
// multi-row INSERT and returns their new ids, in the order of msgs.
//
// Contract:
//   - Validation happens before any SQL runs. An invalid message makes the
//     whole call fail with a [*ValidationError] naming its index and field,
//     and nothing is written.
//   - Ids are UUIDv7, strictly increasing in msgs order, and greater than any
//     id this process generated before (whatever the goroutine). Within one
//     call, AUTO_INCREMENT ids follow the same order.
//   - Zero messages is a no-op: no SQL, nil ids, nil error.
//   - One INSERT per call unless the messages exceed 5,000 or
//     MaxStatementBytes (4 MiB by default; 1,000 messages of up to about 4 KB
//     each stay in one statement). Then the call runs several INSERTs in
//     order, on ex. They are atomic only if ex is a transaction: with a
//     *sql.DB, an error may leave the earlier statements' messages written.
//   - On a database error the returned ids are nil; roll the transaction back.
//   - When ctx carries a span (OpenTelemetry), its W3C trace context goes
//     into every message's Headers (traceparent, tracestate when set,
//     baggage when set), unless NoTracePropagation; see Propagator. msgs
//     and their Headers maps are not modified.
func (w Writer) Enqueue(ctx context.Context, ex Execer, msgs ...Message) ([]MessageID, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	table := w.Table
	if table == "" {
		table = DefaultTable
	}
	quoted, err := QuoteTable(table)
	if err != nil {
		return nil, fmt.Errorf("enqueue %d messages: %w", len(msgs), err)
	}
	msgs = w.withTraceContext(ctx, msgs)
	rows := make([]prepared, len(msgs))
	for i := range msgs {
		if rows[i], err = prepare(i, &msgs[i]); err != nil {
			return nil, fmt.Errorf("enqueue %d messages: %w", len(msgs), err)
		}
	}
	ids, err := newIDs(len(msgs))
	if err != nil {
		return nil, fmt.Errorf("enqueue %d messages: %w", len(msgs), err)
	}

	maxBytes := w.MaxStatementBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxStatementBytes
	}
	for start := 0; start < len(msgs); {
		end, size := start, 0
		for end < len(msgs) && end-start < maxRowsPerStatement &&
			(end == start || size+rows[end].size <= maxBytes) {
			size += rows[end].size
			end++
		}
		if err := insert(ctx, ex, quoted, msgs[start:end], rows[start:end], ids[start:end]); err != nil {
			if start == 0 && end == len(msgs) {
				return nil, fmt.Errorf("enqueue %d messages into %s: %w", len(msgs), quoted, err)
			}
			return nil, fmt.Errorf("enqueue %d messages into %s: insert messages %d to %d: %w",
				len(msgs), quoted, start, end-1, err)
		}
		start = end
	}
	return ids, nil
}

// insert runs one multi-row INSERT.
func insert(ctx context.Context, ex Execer, table string, msgs []Message, rows []prepared, ids []MessageID) error {
	var q strings.Builder
	q.Grow(40 + len(table) + len(insertColumns) + len(msgs)*(len(rowPlaceholders)+1))
	q.WriteString("INSERT INTO ")
	q.WriteString(table)
	q.WriteByte(' ')
	q.WriteString(insertColumns)
	q.WriteString(" VALUES ")
	args := make([]any, 0, len(msgs)*argsPerRow)
	for i := range msgs {
		if i > 0 {
			q.WriteByte(',')
		}
		q.WriteString(rowPlaceholders)
		m, r := &msgs[i], &rows[i]
		payload := m.Payload
		if payload == nil {
			payload = []byte{} // NOT NULL column: a nil payload is an empty body
		}
		args = append(args, ids[i][:], m.PartitionKey, m.Exchange, m.RoutingKey, m.MessageType,
			r.headers, payload, r.contentType, r.availableAt)
	}
	_, err := ex.ExecContext(ctx, q.String(), args...)
	return err
}

// QuoteTable checks that name is a plain table identifier (1 to 64
// characters out of [A-Za-z0-9_$], not all digits) and returns it quoted with
// backticks, ready to splice into SQL. Schema-qualified names are not
// accepted: the table lives in the DSN's database.
func QuoteTable(name string) (string, error) {
	if name == "" || len(name) > 64 {
		return "", fmt.Errorf("table name %q: must be 1 to 64 characters", name)
	}
	digits := true
	for _, c := range []byte(name) {
		switch {
		case c >= '0' && c <= '9':
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_', c == '$':
			digits = false
		default:
			return "", fmt.Errorf("table name %q: only letters, digits, '_' and '$' are allowed", name)
		}
	}
	if digits {
		return "", fmt.Errorf("table name %q: must not be all digits", name)
	}
	return "`" + name + "`", nil
}
