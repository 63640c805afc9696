package maintenance

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// queryer is *sql.DB or *sql.Tx.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// failure is what a retry reads of one outbox_failed row: the columns it
// puts back (the payload as a digest).
type failure struct {
	id, outboxID                    uint64
	messageID                       outbox.MessageID
	key, exchange, rk, mt, ct, psum string
	headers                         []byte // nil when NULL
	plen                            int64
}

const failureColumns = "f.id, f.outbox_id, f.message_id, f.partition_key, f.exchange, f.routing_key, f.message_type, " +
	"f.content_type, SHA2(f.payload, 256), LENGTH(f.payload), f.headers"

// sameMessage reports whether a and b are copies of one message: a retry
// of either puts back the same row (headers compared as JSON values).
func (a failure) sameMessage(b failure) bool {
	return a.messageID == b.messageID && a.key == b.key && a.exchange == b.exchange && a.rk == b.rk && a.mt == b.mt &&
		a.ct == b.ct && a.psum == b.psum && a.plen == b.plen && sameJSON(a.headers, b.headers)
}

func sameJSON(a, b []byte) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	va, ea := decodeJSON(a)
	vb, eb := decodeJSON(b)
	if ea != nil || eb != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(va, vb)
}

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// retryUnit is one message a retry puts back: every failure of a message
// id named, plus the failures of it named by row id; or one failure
// without a UUID.
type retryUnit struct {
	msg   outbox.MessageID // zero: the failure has no UUID
	byRow uint64           // the row id it was first named by; 0: named by message id
	rows  []failure        // in id order
}

// retryPlan is what one retry transaction does.
type retryPlan struct {
	retried   []Retried
	skipped   []Skipped
	templates []failure // the row each retried message is rebuilt from, in retried's order
	failedIDs []uint64  // outbox_failed rows to delete
	delivered []uint64  // outbox copies marked delivered to delete
}

// planRetry reads the failures targets name (locking them when lock) and
// decides what to retry and what to skip (decideRetry). A retried message
// without a UUID gets its new UUIDv7 here, unless lock is false (a dry run).
func planRetry(ctx context.Context, q queryer, table string, targets []target, lock bool) (retryPlan, error) {
	units, skipped, err := readUnits(ctx, q, targets, lock)
	if err != nil {
		return retryPlan{}, err
	}
	copies, err := outboxCopies(ctx, q, table, units)
	if err != nil {
		return retryPlan{}, fmt.Errorf("look the messages up in %s: %w", table, err)
	}
	p := decideRetry(table, units, copies)
	p.skipped = append(skipped, p.skipped...)
	if lock {
		if err := p.newMessageIDs(); err != nil {
			return p, err
		}
	}
	return p, nil
}

// decideRetry plans the retry of units, given the outbox copies of their
// message ids: a unit whose failures differ, or whose message is still
// pending in the outbox, is skipped; the others are retried from their
// newest failure, replacing the copies marked delivered. It reads nothing.
func decideRetry(table string, units []*retryUnit, copies map[outbox.MessageID][]copyRow) retryPlan {
	var p retryPlan
	for _, u := range units {
		newest := u.rows[len(u.rows)-1]
		skip := func(reason string) {
			p.skipped = append(p.skipped, Skipped{MessageID: u.msg, RowID: u.byRow, Reason: reason})
		}
		if reason := differ(u); reason != "" {
			skip(reason)
			continue
		}
		r := Retried{MessageID: u.msg, NewMessageID: u.msg == (outbox.MessageID{})}
		if c, ok := pendingCopy(copies[u.msg]); !r.NewMessageID && ok {
			skip(fmt.Sprintf("still pending in %s as id %d: it will be delivered from there", strings.Trim(table, "`"), c))
			continue
		}
		if !r.NewMessageID {
			for _, c := range copies[u.msg] {
				p.delivered = append(p.delivered, c.id)
				r.ReplacedDelivered = true
			}
		}
		for _, f := range u.rows {
			r.RowIDs = append(r.RowIDs, f.id)
		}
		p.failedIDs = append(p.failedIDs, r.RowIDs...)
		p.retried = append(p.retried, r)
		p.templates = append(p.templates, newest)
	}
	return p
}

// differ says why the failures of u are not copies of one message, or "".
func differ(u *retryUnit) string {
	newest := u.rows[len(u.rows)-1]
	for _, f := range u.rows[:len(u.rows)-1] {
		if !f.sameMessage(newest) {
			return fmt.Sprintf("its failed rows %s differ (payload, headers or properties): they are not copies of one message "+
				"and only one can go back under its id: retry the one to deliver by its row id and purge the others by theirs "+
				"(failed show %s lists them)",
				joinIDs(rowIDs(u.rows)), u.msg)
		}
	}
	return ""
}

func rowIDs(rows []failure) []uint64 {
	out := make([]uint64, len(rows))
	for i, f := range rows {
		out[i] = f.id
	}
	return out
}

// joinIDs writes ids as "3, 5 and 8".
func joinIDs(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(id, 10)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// newMessageIDs gives each retried message without a UUID a new UUIDv7,
// in the order the messages go into the outbox.
func (p *retryPlan) newMessageIDs() error {
	order := make([]int, len(p.retried))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return compareInsertOrder(p.templates[a], p.templates[b]) })
	for _, i := range order {
		if !p.retried[i].NewMessageID {
			continue
		}
		u, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("make a message id for failed row %d: %w", p.templates[i].id, err)
		}
		p.retried[i].MessageID = outbox.MessageID(u)
	}
	return nil
}

// compareInsertOrder orders failures as a retry inserts them: by their
// original outbox id, then their own id.
func compareInsertOrder(a, b failure) int {
	return cmp.Or(cmp.Compare(a.outboxID, b.outboxID), cmp.Compare(a.id, b.id))
}

// readUnits reads the failures targets name and groups them into the
// messages to retry, in the order they were first named; a target naming
// nothing is skipped.
func readUnits(ctx context.Context, q queryer, targets []target, lock bool) ([]*retryUnit, []Skipped, error) {
	suffix := " ORDER BY f.id"
	if lock {
		suffix += " FOR UPDATE" // a concurrent retry of the same message waits, then finds nothing
	}
	msgs, rows := splitTargets(targets)
	byMsg := map[outbox.MessageID][]failure{}
	byRow := map[uint64]failure{}
	scan := func(rs *sql.Rows) error {
		f, err := scanFailure(rs)
		if err == nil {
			byRow[f.id] = f
			if slices.Contains(msgs, f.messageID) {
				byMsg[f.messageID] = append(byMsg[f.messageID], f)
			}
		}
		return err
	}
	if err := queryByMessageID(ctx, q, "SELECT "+failureColumns+" FROM "+FailedTable+" AS f WHERE f.message_id IN (%s)"+suffix, msgs, scan); err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", FailedTable, err)
	}
	if len(rows) > 0 {
		if err := queryRows(ctx, q, "SELECT "+failureColumns+" FROM "+idRows(rows, "k")+" STRAIGHT_JOIN "+FailedTable+
			" AS f ON f.id = k.id"+suffix, scan); err != nil {
			return nil, nil, fmt.Errorf("read %s: %w", FailedTable, err)
		}
	}
	return groupUnits(targets, byMsg, byRow)
}

// groupUnits makes the retry units of targets from the failures read.
func groupUnits(targets []target, byMsg map[outbox.MessageID][]failure, byRow map[uint64]failure) ([]*retryUnit, []Skipped, error) {
	var (
		units   []*retryUnit
		skipped []Skipped
		withID  = map[outbox.MessageID]*retryUnit{}
	)
	add := func(key outbox.MessageID, byRowID uint64, fs ...failure) {
		u := withID[key]
		if u == nil || key == (outbox.MessageID{}) {
			u = &retryUnit{msg: key, byRow: byRowID}
			units = append(units, u)
			withID[key] = u
		}
		for _, f := range fs {
			if !slices.ContainsFunc(u.rows, func(g failure) bool { return g.id == f.id }) {
				u.rows = append(u.rows, f)
			}
		}
		slices.SortFunc(u.rows, func(a, b failure) int { return cmp.Compare(a.id, b.id) })
	}
	for _, t := range targets {
		if t.row == 0 {
			if fs := byMsg[t.msg]; len(fs) > 0 {
				add(t.msg, 0, fs...)
			} else {
				skipped = append(skipped, Skipped{MessageID: t.msg, Reason: "not in " + FailedTable + " (never failed, or already retried or purged)"})
			}
			continue
		}
		f, ok := byRow[t.row]
		if !ok {
			skipped = append(skipped, Skipped{RowID: t.row, Reason: "not in " + FailedTable + " (already retried or purged, or never there)"})
			continue
		}
		add(f.messageID, t.row, f)
	}
	return units, skipped, nil
}

func scanFailure(rs *sql.Rows) (failure, error) {
	var f failure
	var mid []byte
	if err := rs.Scan(&f.id, &f.outboxID, &mid, &f.key, &f.exchange, &f.rk, &f.mt, &f.ct, &f.psum, &f.plen, &f.headers); err != nil {
		return f, err
	}
	if len(mid) != len(f.messageID) {
		return f, fmt.Errorf("%s row %d: message_id is %d bytes, want %d", FailedTable, f.id, len(mid), len(f.messageID))
	}
	copy(f.messageID[:], mid)
	return f, nil
}

// copyRow is a row of the outbox holding a message being retried.
type copyRow struct {
	id        uint64
	delivered bool
}

// outboxCopies returns the outbox rows of the units' message ids (none for
// failures without a UUID).
func outboxCopies(ctx context.Context, q queryer, table string, units []*retryUnit) (map[outbox.MessageID][]copyRow, error) {
	var ids []outbox.MessageID
	for _, u := range units {
		if u.msg != (outbox.MessageID{}) {
			ids = append(ids, u.msg)
		}
	}
	copies := map[outbox.MessageID][]copyRow{}
	err := queryByMessageID(ctx, q, "SELECT message_id, id, delivered_at IS NOT NULL FROM "+table+" WHERE message_id IN (%s)", ids,
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
	return copies, err
}

// pendingCopy returns the id of a copy still to be delivered, if any.
func pendingCopy(copies []copyRow) (uint64, bool) {
	for _, c := range copies {
		if !c.delivered {
			return c.id, true
		}
	}
	return 0, false
}

// apply carries the plan out in tx: delivered copies deleted, the messages
// inserted in their original order (so two retried messages of one
// partition key keep theirs), their new ids read, the failed rows they
// came from deleted.
func (p *retryPlan) apply(ctx context.Context, tx *sql.Tx, table string) error {
	if len(p.retried) == 0 {
		return nil
	}
	if len(p.delivered) > 0 {
		if _, err := tx.ExecContext(ctx, "DELETE o FROM "+idRows(p.delivered, "k")+" STRAIGHT_JOIN "+table+
			" AS o ON o.id = k.id WHERE o.delivered_at IS NOT NULL"); err != nil {
			return fmt.Errorf("delete %d delivered copies from %s: %w", len(p.delivered), table, err)
		}
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+table+
		" (message_id, partition_key, exchange, routing_key, message_type, headers, payload, content_type, created_at)"+
		" SELECT UNHEX(k.m), f.partition_key, f.exchange, f.routing_key, f.message_type, f.headers, f.payload, f.content_type, UTC_TIMESTAMP(6)"+
		" FROM "+p.templateRows()+" STRAIGHT_JOIN "+FailedTable+" AS f ON f.id = k.id ORDER BY f.outbox_id, f.id"); err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1062 {
			return fmt.Errorf("insert %d messages into %s: one of them was inserted there meanwhile (%w); run the retry again to see which", len(p.retried), table, err)
		}
		return fmt.Errorf("insert %d messages into %s: %w", len(p.retried), table, err)
	}
	ids := make([]outbox.MessageID, len(p.retried))
	for i, r := range p.retried {
		ids[i] = r.MessageID
	}
	newIDs := map[outbox.MessageID]uint64{}
	err := queryByMessageID(ctx, tx, "SELECT message_id, id FROM "+table+" WHERE message_id IN (%s) AND delivered_at IS NULL", ids,
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
	for i := range p.retried {
		p.retried[i].NewID = newIDs[p.retried[i].MessageID]
	}
	if _, err := tx.ExecContext(ctx, "DELETE f FROM "+idRows(p.failedIDs, "k")+" STRAIGHT_JOIN "+FailedTable+
		" AS f ON f.id = k.id"); err != nil {
		return fmt.Errorf("delete %d rows of %s: %w", len(p.failedIDs), FailedTable, err)
	}
	return nil
}

// templateRows is a row source of the template rows' ids (k.id) and the
// message id each goes back under as hex text (k.m), for a STRAIGHT_JOIN
// to outbox_failed by primary key. Everything in it is digits and hex,
// inlined.
func (p *retryPlan) templateRows() string {
	var b strings.Builder
	b.WriteString("JSON_TABLE('[")
	for i, f := range p.templates {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":%d,"m":"%s"}`, f.id, hex.EncodeToString(p.retried[i].MessageID[:]))
	}
	b.WriteString("]', '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id', m CHAR(32) PATH '$.m')) AS k")
	return b.String()
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
		if err := queryRows(ctx, q, fmt.Sprintf(query, "?"+strings.Repeat(",?", n-1)), scan, args...); err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}

// queryRows runs query, calling scan for each row.
func queryRows(ctx context.Context, q queryer, query string, scan func(*sql.Rows) error, args ...any) error {
	rows, err := q.QueryContext(ctx, query, args...)
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
}
