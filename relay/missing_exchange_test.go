package relay

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// Bad input costs its neighbours nothing, in binlog and in poll mode: every
// 50th row names an exchange that does not exist. Those rows end in
// outbox_failed; every other row arrives exactly once (no copies from a
// channel the broker closed), first deliveries in commit order per partition.
func TestRelayMissingExchangeCostsNeighboursNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{ModeBinlog, ModePoll} {
		t.Run(string(mode), func(t *testing.T) {
			db, b := setup(t)
			v := consume(t, b, b.Queue)
			startRelay(t, db, b, func(c *Config) { c.Mode = mode })
			ctx := testenv.Context(t, time.Minute)

			const total, keys, txn = 3_000, 30, 10
			missing := b.Exchange + ".missing"
			bad := map[string]bool{}
			for seq := 0; seq < total; seq += txn {
				msgs := make([]outbox.Message, txn)
				for i := range msgs {
					n := seq + i + 1
					msgs[i] = outbox.Message{
						PartitionKey: fmt.Sprintf("order-%d", n%keys), Exchange: b.Exchange,
						RoutingKey: fmt.Sprintf("rk.%d", n%keys), MessageType: "test.event",
						Headers: map[string]any{"n": int64(n)}, Payload: []byte(fmt.Sprintf(`{"n":%d}`, n)),
					}
					if n%50 == 0 {
						msgs[i].Exchange = missing
					}
				}
				ids := enqueue(ctx, t, db, msgs)
				for i, m := range msgs {
					if m.Exchange == missing {
						bad[ids[i].String()] = true
						continue
					}
					v.Expect(validator.Expected{ID: ids[i], PartitionKey: m.PartitionKey, Exchange: m.Exchange,
						RoutingKey: m.RoutingKey, MessageType: m.MessageType, Payload: m.Payload, Headers: m.Headers})
				}
			}
			if err := v.WaitComplete(ctx); err != nil {
				t.Fatal(err)
			}
			waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
			waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox_failed", len(bad))
			rows, err := db.SQL.QueryContext(ctx, "SELECT message_id, exchange, error FROM outbox_failed")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for rows.Next() {
				var id []byte
				var exchange, reason string
				if err := rows.Scan(&id, &exchange, &reason); err != nil {
					t.Fatal(err)
				}
				var mid outbox.MessageID
				copy(mid[:], id)
				if !bad[mid.String()] || exchange != missing {
					t.Errorf("outbox_failed holds %s (exchange %q, %s), not a row naming the missing exchange", mid, exchange, reason)
				} else if !strings.Contains(reason, "exchange not found") {
					t.Errorf("outbox_failed row %s: error %q does not say the exchange was not found", mid, reason)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if err := v.Check(validator.ExactlyOnce); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// enqueue commits msgs in one transaction and returns their message ids.
func enqueue(ctx context.Context, t *testing.T, db *testenv.DB, msgs []outbox.Message) []outbox.MessageID {
	t.Helper()
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ids, err := outbox.Enqueue(ctx, tx, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}
