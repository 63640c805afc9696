package relay

import (
	"context"
	"database/sql"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// foreignRow is one row a non-Go producer writes with SQL, and what its
// message must carry.
type foreignRow struct {
	partitionKey, messageType string
	headers                   string         // SQL expression for the headers column
	payload                   string         // SQL expression for the payload column
	wantHeaders               amqp.Table     // the row's headers as an amqp091 consumer decodes them
	producerHeaders           map[string]any // the same, as the producer meant them (for the validator)
	failed                    string         // non-empty: the row goes to outbox_failed with this in its error
}

func nestedJSON(n int, leaf string) string {
	return strings.Repeat(`{"d":`, n) + leaf + strings.Repeat(`}`, n)
}

func nestedTable(n int, leaf any) any {
	for range n {
		leaf = amqp.Table{"d": leaf}
	}
	return leaf
}

func nestedMap(n int, leaf any) any {
	for range n {
		leaf = map[string]any{"d": leaf}
	}
	return leaf
}

// foreignRows: what a PHP or Python service writes with the mariadb client
// forms: JSON_OBJECT headers with an unsigned 64-bit number, a null, a
// nested object and array, floats and a decimal no double holds; raw JSON
// text with numbers beyond float64 and nested as deep as MariaDB's JSON
// takes (31 levels with the outer object); message_type ” (type unset);
// binary payloads.
func foreignRows() []foreignRow {
	return []foreignRow{
		{
			partitionKey: "wire-ü", messageType: "order.placed",
			headers: `JSON_OBJECT('big', 18446744073709551615, 'nothing', NULL, 'nested', JSON_OBJECT('a', 1, 'b', JSON_ARRAY(TRUE, NULL, 'x')),
				'ratio', 0.25, 'pi', 3.141592653589793, 'n', 42, 'neg', -9223372036854775808, 'name', 'ünï ✓',
				'precise', 0.1000000000000000000001, 'flag', FALSE)`,
			payload: `UNHEX('00FF00C3A9')`,
			wantHeaders: amqp.Table{"big": "18446744073709551615", "nothing": nil,
				"nested": amqp.Table{"a": int64(1), "b": []any{true, nil, "x"}}, "ratio": 0.25, "pi": 3.141592653589793,
				"n": int64(42), "neg": int64(math.MinInt64), "name": "ünï ✓", "precise": "0.1000000000000000000001", "flag": false},
			producerHeaders: map[string]any{"big": uint64(math.MaxUint64), "nothing": nil,
				"nested": map[string]any{"a": 1, "b": []any{true, nil, "x"}}, "ratio": 0.25, "pi": 3.141592653589793,
				"n": 42, "neg": int64(math.MinInt64), "name": "ünï ✓", "precise": json.Number("0.1000000000000000000001"), "flag": false},
		},
		{
			partitionKey: "wire-ü", messageType: "",
			headers: "NULL", payload: `'{"plain":true}'`,
			wantHeaders: amqp.Table{}, producerHeaders: nil,
		},
		{
			partitionKey: "wire-ü", messageType: "raw.json",
			headers: `'{"huge":1e400,"tiny":1e-400,"e21":1e21,"two":2.0,"deep":` + nestedJSON(30, "null") + `}'`,
			payload: `REPEAT(UNHEX('00'), 3)`,
			wantHeaders: amqp.Table{"huge": "1e400", "tiny": "1e-400", "e21": 1e21, "two": int64(2),
				"deep": nestedTable(30, nil)},
			producerHeaders: map[string]any{"huge": json.Number("1e400"), "tiny": json.Number("1e-400"), "e21": 1e21, "two": 2,
				"deep": nestedMap(30, nil)},
		},

		{
			partitionKey: "", messageType: "no.key",
			headers: `JSON_OBJECT('k', 'v')`, payload: `''`,
			wantHeaders: amqp.Table{"k": "v"}, producerHeaders: map[string]any{"k": "v"},
		},
	}
}

// writeForeign writes rows in one transaction on a session in time_zone
// '+05:00', created_at left to the column default and message_id from
// UUID(), and returns each row's message_id and created_at as stored, and
// the server's UTC clock before and after.
func writeForeign(ctx context.Context, t *testing.T, db *sql.DB, exchange string, rows []foreignRow) (ids []outbox.MessageID, created []time.Time, before, after time.Time) {
	t.Helper()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	defer conn.ExecContext(context.WithoutCancel(ctx), "SET time_zone = DEFAULT")
	if _, err := conn.ExecContext(ctx, "SET time_zone = '+05:00'"); err != nil {
		t.Fatal(err)
	}
	parse := func(s string) time.Time {
		v, err := time.Parse("2006-01-02 15:04:05.999999", s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var s string
	if err := conn.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(6)").Scan(&s); err != nil {
		t.Fatal(err)
	}
	before = parse(s)
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, r := range rows {
		q := `INSERT INTO outbox (message_id, partition_key, exchange, routing_key, message_type, headers, payload)
			VALUES (UNHEX(REPLACE(UUID(), '-', '')), ?, ?, 'wire.test', ?, ` + r.headers + `, ` + r.payload + `)`
		if _, err := tx.ExecContext(ctx, q, r.partitionKey, exchange, r.messageType); err != nil {
			t.Fatalf("%s: %v", q, err)
		}

		var mid []byte
		if err := tx.QueryRowContext(ctx, "SELECT message_id, created_at FROM outbox WHERE id = LAST_INSERT_ID()").Scan(&mid, &s); err != nil {
			t.Fatal(err)
		}
		var id outbox.MessageID
		copy(id[:], mid)
		ids, created = append(ids, id), append(created, parse(s))
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(6)").Scan(&s); err != nil {
		t.Fatal(err)
	}
	return ids, created, before, parse(s)
}

// Rows written the way a PHP or Python service writes them, on a session in
// time_zone '+05:00', arrive at an amqp091 consumer as docs/wire.md says, in
// binlog mode and in poll mode: created_at is the UTC instant of the insert,
// the timestamp is it cut to the second and x-created-at is it to the
// microsecond; every header value is carried exactly (numbers no double
// holds as their JSON text, null as void, objects and arrays nested);
// message_type ” leaves type unset.
func TestWireContractForForeignProducers(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{ModeBinlog, ModePoll} {
		t.Run(string(mode), func(t *testing.T) {
			db, b := setup(t)
			v := consume(t, b, b.Queue)
			startRelay(t, db, b, func(c *Config) { c.Mode = mode })
			ctx := testenv.Context(t, time.Minute)

			rows := foreignRows()
			ids, created, before, after := writeForeign(ctx, t, db.SQL, b.Exchange, rows)
			for i, r := range rows {
				if c := created[i]; c.Before(before) || c.After(after) {
					t.Errorf("row %d: created_at %s from a '+05:00' session, want the UTC instant between %s and %s",
						i, c.Format(time.RFC3339Nano), before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano))
				}
				if r.failed != "" {
					continue
				}
				v.Expect(validator.Expected{ID: ids[i], PartitionKey: r.partitionKey, Exchange: b.Exchange,
					RoutingKey: "wire.test", MessageType: r.messageType, Payload: payloadOf(r.payload),
					Headers: r.producerHeaders, CreatedAt: created[i]})
			}
			if err := v.WaitComplete(ctx); err != nil {
				t.Fatal(err)
			}
			waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
			if err := v.Check(validator.ExactlyOnce); err != nil {
				t.Fatal(err)
			}
			// The exact AMQP types, beyond the validator's value checks.
			byID := map[string]amqp.Delivery{}
			for _, d := range v.Deliveries() {
				byID[d.MessageId] = d
			}
			for i, r := range rows {
				if r.failed != "" {
					continue
				}
				d := byID[ids[i].String()]
				got := amqp.Table{}
				for k, val := range d.Headers {
					if !strings.HasPrefix(k, "x-") {
						got[k] = val
					}
				}
				if !reflect.DeepEqual(got, r.wantHeaders) {
					t.Errorf("row %d headers:\n got %#v\nwant %#v", i, got, r.wantHeaders)
				}
				if want := created[i].Format("2006-01-02T15:04:05.000000Z"); d.Headers["x-created-at"] != want {
					t.Errorf("row %d: x-created-at %v, want %s", i, d.Headers["x-created-at"], want)
				}
				if !d.Timestamp.Equal(created[i].Truncate(time.Second)) {
					t.Errorf("row %d: timestamp %s, want %s", i, d.Timestamp.UTC(), created[i].Truncate(time.Second))
				}
			}
			waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox_failed", 0)
		})
	}
}

// payloadOf evaluates the few payload SQL expressions foreignRows uses.
func payloadOf(expr string) []byte {
	switch expr {
	case `UNHEX('00FF00C3A9')`:
		return []byte{0x00, 0xff, 0x00, 0xc3, 0xa9}
	case `REPEAT(UNHEX('00'), 3)`:
		return []byte{0, 0, 0}
	}
	return []byte(strings.Trim(expr, "'"))
}

// Header values nest at most 32 levels (amqp091-go consumers refuse deeper
// tables and close their connection): a row at the limit reaches an amqp091
// consumer whole; one a level deeper goes to outbox_failed with the reason,
// and its partition moves on in order. MariaDB's JSON takes 31 levels in
// all, MySQL's 100: both headers columns become plain LONGTEXT here (which
// migrate accepts) to stand in for a MySQL server.
func TestWireHeaderDepthLimit(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	ctx := testenv.Context(t, time.Minute)
	for _, table := range []string{"outbox", "outbox_failed"} {
		if _, err := db.SQL.ExecContext(ctx, "ALTER TABLE "+table+" MODIFY headers LONGTEXT NULL"); err != nil {
			t.Fatal(err)
		}
	}
	v := consume(t, b, b.Queue)
	startRelay(t, db, b, nil)
	rows := []foreignRow{
		{partitionKey: "deep", messageType: "first", headers: "NULL", payload: `'1'`, wantHeaders: amqp.Table{}},
		{partitionKey: "deep", messageType: "too.deep", headers: `'{"deep":` + nestedJSON(33, "1") + `}'`, payload: `'2'`,
			failed: `header "deep": nested deeper than 32 levels`},
		{partitionKey: "deep", messageType: "deepest", headers: `'{"deep":` + nestedJSON(32, `"leaf"`) + `}'`, payload: `'3'`,
			wantHeaders: amqp.Table{"deep": nestedTable(32, "leaf")}, producerHeaders: map[string]any{"deep": nestedMap(32, "leaf")}},
	}
	ids, created, _, _ := writeForeign(ctx, t, db.SQL, b.Exchange, rows)
	for i, r := range rows {
		if r.failed == "" {
			v.Expect(validator.Expected{ID: ids[i], PartitionKey: r.partitionKey, Exchange: b.Exchange,
				RoutingKey: "wire.test", MessageType: r.messageType, Payload: payloadOf(r.payload),
				Headers: r.producerHeaders, CreatedAt: created[i]})
		}
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	var reason string
	if err := db.SQL.QueryRowContext(ctx, "SELECT error FROM outbox_failed WHERE message_type = 'too.deep'").Scan(&reason); err != nil {
		t.Fatalf("the too deeply nested row in outbox_failed: %v", err)
	}
	if !strings.Contains(reason, rows[1].failed) {
		t.Errorf("outbox_failed error %q, want it to say %q", reason, rows[1].failed)
	}
}
