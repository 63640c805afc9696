package poller_test

import (
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// A row that cannot be published, whose reason is long and not ASCII (a
// header name of 400 CJK characters: cut to 1,024 bytes it would end in the
// middle of a character, which the server refuses), goes to outbox_failed
// with a valid reason, and its round commits once: the rows published with
// it in the same round arrive exactly once.
func TestRoundWithLongNonASCIIFailureReasonCommitsOnce(t *testing.T) {
	e := setup(t, checkpoint.Delete)
	ctx := testenv.Context(t, time.Minute)
	v := consume(t, e.broker)
	name := strings.Repeat("漢", 400)
	headers, err := json.Marshal(map[string]any{name: nil})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		var id outbox.MessageID
		if _, err := rand.Read(id[:]); err != nil {
			t.Fatal(err)
		}
		payload := []byte(`{"i":` + string(rune('0'+i)) + `}`)
		var h any
		if i == 2 {
			h = string(headers) // null header value: not publishable
		} else {
			v.Expect(validator.Expected{ID: id, PartitionKey: "order-1", Exchange: e.broker.Exchange,
				RoutingKey: "rk", Payload: payload})
		}
		if _, err := e.pool.ExecContext(ctx, "INSERT INTO outbox (message_id, partition_key, routing_key, headers, payload) VALUES (?, 'order-1', 'rk', ?, ?)",
			id[:], h, payload); err != nil {
			t.Fatal(err)
		}
	}

	stop, _ := run(t, e.poller(t, nil))
	for count(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox") > 0 {
		if v.Duplicates() > 0 {
			t.Fatalf("%d duplicate deliveries: the round was repeated", v.Duplicates())
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the outbox never emptied (%d deliveries): %v", v.Received(), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	var reason string
	if err := e.pool.QueryRowContext(ctx, "SELECT error FROM outbox_failed").Scan(&reason); err != nil {
		t.Fatalf("the unpublishable row is not in outbox_failed: %v", err)
	}
	if !utf8.ValidString(reason) || !strings.Contains(reason, "漢") || len(reason) > 1024 {
		t.Fatalf("stored reason %q (%d bytes): want valid UTF-8 naming the header, at most 1024 bytes", reason, len(reason))
	}
}
