package checkpoint

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
)

const failedColumns = "outbox_id, message_id, partition_key, exchange, routing_key, message_type, headers, " +
	"payload, content_type, created_at, available_at, error, source, failed_at"

// maxReason bounds the failure reason stored in outbox_failed.error.
const maxReason = 1024

// insertFailed records failed rows in outbox_failed, 100 per statement. One
// row that cannot be stored must not block the others, nor the
// acknowledgement: when a statement fails on its data, the rows go one at a
// time, and a row the server still refuses is stored with a plain-ASCII
// reason that says so — and, if even that is refused, without its headers
// (the one other value that is not simply copied from a column of the same
// type: a JSON document the server may judge differently).
func (s *Store) insertFailed(ctx context.Context, ex Execer, failed []ordering.Failure) error {
	for len(failed) > 0 {
		n := min(len(failed), 100)
		err := s.insertFailedRows(ctx, ex, failed[:n], "", false)
		if err != nil && dataError(err) {
			err = s.insertFailedEach(ctx, ex, failed[:n])
		}
		if err != nil {
			return fmt.Errorf("record %d failed messages in outbox_failed: %w", n, err)
		}
		failed = failed[n:]
	}
	return nil
}

func (s *Store) insertFailedEach(ctx context.Context, ex Execer, failed []ordering.Failure) error {
	for i := range failed {
		one := failed[i : i+1]
		err := s.insertFailedRows(ctx, ex, one, "", false)
		if err != nil && dataError(err) {
			err = s.insertFailedRows(ctx, ex, one, unstorableReason(one[0].Reason, err, false, nil), false)
		}
		if err != nil && dataError(err) {
			err = s.insertFailedRows(ctx, ex, one, unstorableReason(one[0].Reason, err, true, one[0].Record.Headers), true)
		}
		if err != nil {
			return fmt.Errorf("message %s (outbox id %d): %w", one[0].Record.MessageID, one[0].Record.ID, err)
		}
	}
	return nil
}

// insertFailedRows runs one INSERT of failed; reason, when not empty,
// replaces every row's own, and noHeaders stores NULL headers.
func (s *Store) insertFailedRows(ctx context.Context, ex Execer, failed []ordering.Failure, reason string, noHeaders bool) error {
	var b strings.Builder
	args := make([]any, 0, 12*len(failed))
	b.WriteString("INSERT INTO outbox_failed (" + failedColumns + ") VALUES ")
	for i, f := range failed {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?,?,?,?,?,?,?,'relay',NOW(6))")
		r := f.Record
		var headers, available any
		if r.Headers != nil && !noHeaders {
			headers = string(r.Headers)
		}
		if !r.AvailableAt.IsZero() {
			available = r.AvailableAt.UTC()
		}
		why := reason
		if why == "" {
			why = truncate(f.Reason, maxReason)
		}
		args = append(args, r.ID, r.MessageID[:], r.PartitionKey, r.Exchange, r.RoutingKey, r.MessageType,
			headers, r.Payload, r.ContentType, r.CreatedAt.UTC(), available, why)
	}
	_, err := ex.ExecContext(ctx, b.String(), args...)
	return err
}

// unstorableReason is the reason stored when the server refused the row as
// it was: plain ASCII, saying why (and that the headers were left out, when
// they were), then the original reason and headers escaped, as far as it
// all fits.
func unstorableReason(reason string, err error, noHeaders bool, headers []byte) string {
	var b strings.Builder
	b.WriteString("the failed row could not be stored as it was (MySQL error ")
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		b.WriteString(strconv.Itoa(int(me.Number)))
	} else {
		b.WriteByte('?')
	}
	b.WriteByte(')')
	if noHeaders {
		b.WriteString("; stored without its headers")
	}
	b.WriteString("; reason, escaped: " + strconv.QuoteToASCII(reason))
	if noHeaders {
		b.WriteString("; headers, escaped: " + strconv.QuoteToASCII(string(headers)))
	}
	return truncate(b.String(), maxReason)
}

// dataError reports whether the server refused a statement for the values
// it carried (string not valid in the column's character set, too long, out
// of range, invalid JSON, ...): the same statement with other values may pass.
func dataError(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1048, // column cannot be null
		1264, // out of range
		1265, // data truncated
		1292, // incorrect (datetime) value
		1300, // invalid character string
		1366, // incorrect string value
		1367, // illegal value
		1406, // data too long
		3140, // invalid JSON text (MySQL)
		4025: // CONSTRAINT failed, e.g. JSON_VALID (MariaDB)
		return true
	}
	return false
}

// unrecorded returns the failures that outbox_failed does not hold yet (the
// same outbox id and message id, recorded by the relay): an acknowledgement
// repeated after a partial commit or a crash records each failed row once.
func (s *Store) unrecorded(ctx context.Context, tx *sql.Tx, failed []ordering.Failure) ([]ordering.Failure, error) {
	type key struct {
		id  uint64
		msg outbox.MessageID
	}
	have := map[key]bool{}
	for rest := failed; len(rest) > 0; {
		n := min(len(rest), 500)
		args := make([]any, n)
		for i, f := range rest[:n] {
			args[i] = f.Record.MessageID[:]
		}
		q := "SELECT outbox_id, message_id FROM outbox_failed WHERE source = 'relay' AND message_id IN (?" +
			strings.Repeat(",?", n-1) + ")"
		if err := func() error {
			rows, err := tx.QueryContext(ctx, q, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var k key
				var raw []byte
				if err := rows.Scan(&k.id, &raw); err != nil {
					return err
				}
				copy(k.msg[:], raw)
				have[k] = true
			}
			return rows.Err()
		}(); err != nil {
			return nil, fmt.Errorf("look up %d failed messages in outbox_failed: %w", n, err)
		}
		rest = rest[n:]
	}
	if len(have) == 0 {
		return failed, nil
	}
	out := make([]ordering.Failure, 0, len(failed))
	for _, f := range failed {
		if !have[key{f.Record.ID, f.Record.MessageID}] {
			out = append(out, f)
		}
	}
	return out, nil
}
