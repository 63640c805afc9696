package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
)

// rabbitFrameMax is RabbitMQ's default frame_max, which the shared broker
// and the private nodes keep.
const rabbitFrameMax = 131072

// A message the broker can never take costs its neighbours nothing: among
// 300 messages of ten keys, one whose headers hold a 300 KB string (its
// content-header frame is over frame_max, and RabbitMQ would close the
// whole connection over it) and one whose headers are one byte over the
// limit go to outbox_failed with a reason that names the limit and the
// size, as does a payload over --amqp-max-message-size, without a single
// reconnect; one exactly at the limit is delivered; the 301 others arrive
// once each, in commit order per key.
func TestRelayOversizeHeadersGoToFailed(t *testing.T) {
	t.Parallel()
	const maxPayload = 64 << 10 // --amqp-max-message-size
	for _, mode := range []Mode{ModeBinlog, ModePoll} {
		t.Run(string(mode), func(t *testing.T) {
			db, b := setup(t)
			v := consume(t, b, b.Queue)
			reg := prometheus.NewRegistry()
			m, err := metrics.New(reg)
			if err != nil {
				t.Fatal(err)
			}
			startRelay(t, db, b, func(c *Config) {
				c.Mode = mode
				c.Metrics = m
				c.AMQPMaxMessageSize = maxPayload
			})
			ctx := testenv.Context(t, time.Minute)

			big := ordinary(b, 151)
			big.Headers["big"] = strings.Repeat("x", 300<<10)
			atLimit := ordinary(b, 152)
			atLimit.Headers["pad"] = ""
			room := rabbitFrameMax - wireHeaderSize(t, atLimit) // the pad's length that fills the frame
			atLimit.Headers["pad"] = strings.Repeat("p", room)
			over := ordinary(b, 153)
			over.Headers["pad"] = strings.Repeat("p", room+1)
			if got, gotOver := wireHeaderSize(t, atLimit), wireHeaderSize(t, over); got != rabbitFrameMax || gotOver != rabbitFrameMax+1 {
				t.Fatalf("the rows' header frames are %d and %d bytes, want %d and one more", got, gotOver, rabbitFrameMax)
			}
			bigPayload := ordinary(b, 154)
			bigPayload.Payload = []byte(`"` + strings.Repeat("x", maxPayload-1) + `"`)
			bigFrame := wireHeaderSize(t, big)
			failed := map[string]string{} // message id → what its reason must name
			const total, txn = 304, 10
			for seq := 1; seq <= total; seq += txn {
				var msgs []outbox.Message
				reasons := map[int]string{} // index in msgs → the failure it must have
				for n := seq; n < seq+txn && n <= total; n++ {
					switch n {
					case 151:
						reasons[len(msgs)] = fmt.Sprintf("content-header frame of %d bytes, over the connection's frame_max of %d", bigFrame, rabbitFrameMax)
						msgs = append(msgs, big)
					case 152:
						msgs = append(msgs, atLimit)
					case 153:
						reasons[len(msgs)] = fmt.Sprintf("content-header frame of %d bytes, over the connection's frame_max of %d", rabbitFrameMax+1, rabbitFrameMax)
						msgs = append(msgs, over)
					case 154:
						reasons[len(msgs)] = fmt.Sprintf("payload of %d bytes is over the broker's max_message_size of %d bytes", maxPayload+1, maxPayload)
						msgs = append(msgs, bigPayload)
					default:
						msgs = append(msgs, ordinary(b, n))
					}
				}
				expectOrFail(v, failed, enqueue(ctx, t, db, msgs), msgs, reasons)
			}
			checkLimitsRun(ctx, t, db, v, reg, failed, validator.ExactlyOnce)
		})
	}
}

// ordinary is the n-th message of a workload of ten keys, to b's exchange.
func ordinary(b *testenv.Broker, n int) outbox.Message {
	return outbox.Message{
		PartitionKey: fmt.Sprintf("order-%d", n%10), Exchange: b.Exchange,
		RoutingKey: fmt.Sprintf("rk.%d", n%10), MessageType: "test.event",
		Headers: map[string]any{"n": int64(n)}, Payload: []byte(fmt.Sprintf(`{"n":%d}`, n)),
	}
}

func expected(id outbox.MessageID, m outbox.Message) validator.Expected {
	return validator.Expected{ID: id, PartitionKey: m.PartitionKey, Exchange: m.Exchange,
		RoutingKey: m.RoutingKey, MessageType: m.MessageType, Payload: m.Payload, Headers: m.Headers}
}

// wireHeaderSize is the size of the content-header frame the relay sends
// for m: FromRecord of a row like m's (the relay's own headers have the
// same size whatever their values).
func wireHeaderSize(t *testing.T, m outbox.Message) int {
	t.Helper()
	headers, err := json.Marshal(m.Headers)
	if err != nil {
		t.Fatal(err)
	}
	rec := &outbox.Record{
		ID: 1, PartitionKey: m.PartitionKey, Exchange: m.Exchange,
		RoutingKey: m.RoutingKey, MessageType: m.MessageType, Headers: headers, Payload: m.Payload,
		ContentType: outbox.DefaultContentType, CreatedAt: time.Now(),
	}
	msg, err := publish.FromRecord(rec, "", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	return publish.HeaderFrameSize(&msg.Publishing)
}

// checkFailed checks that outbox_failed holds exactly the rows of want,
// each with an error that contains its text.
func checkFailed(ctx context.Context, t *testing.T, db *testenv.DB, want map[string]string) {
	t.Helper()
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox_failed", len(want))
	rows, err := db.SQL.QueryContext(ctx, "SELECT message_id, error FROM outbox_failed")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id []byte
		var reason string
		if err := rows.Scan(&id, &reason); err != nil {
			t.Fatal(err)
		}
		var mid outbox.MessageID
		copy(mid[:], id)
		text, ok := want[mid.String()]
		switch {
		case !ok:
			t.Errorf("outbox_failed holds %s (%s), a row that should have been delivered", mid, reason)
		case !strings.Contains(reason, text):
			t.Errorf("outbox_failed row %s: error %q does not say %q", mid, reason, text)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// amqpReconnects is the relay's count of reconnections to the broker, all
// nodes together.
func amqpReconnects(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "outbox_relay_reconnects_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "target" && l.GetValue() == metrics.TargetAMQP {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// What the broker refuses by closing the channel costs its neighbours
// nothing either: on a node whose max_message_size is 64 KiB (the relay
// assumes RabbitMQ's default, 128 MiB, so it sends the message), a payload
// one byte over it, and a CC header that is a string (RabbitMQ wants an
// array of routing keys), go to outbox_failed with the broker's reason,
// among 300 messages of ten keys that arrive in commit order per key
// (neighbours published again on a new channel may arrive twice), without
// a reconnect.
func TestRelayBrokerRefusalsGoToFailed(t *testing.T) {
	t.Parallel()
	const maxMessageSize = 64 << 10
	node := testenv.StartRabbitMQ(t, testenv.RabbitMaxMessageSize(maxMessageSize))
	for _, mode := range []Mode{ModeBinlog, ModePoll} {
		t.Run(string(mode), func(t *testing.T) {
			db := testenv.MySQL(t)
			db.Migrate(testenv.Context(t, time.Minute), t)
			b := node.Broker(t)
			v := consume(t, b, b.Queue)
			reg := prometheus.NewRegistry()
			m, err := metrics.New(reg)
			if err != nil {
				t.Fatal(err)
			}
			startRelay(t, db, b, func(c *Config) {
				c.Mode = mode
				c.Metrics = m
			})
			ctx := testenv.Context(t, time.Minute)

			failed := map[string]string{}
			const total, txn = 302, 10
			for seq := 1; seq <= total; seq += txn {
				var msgs []outbox.Message
				reasons := map[int]string{}
				for n := seq; n < seq+txn && n <= total; n++ {
					msg := ordinary(b, n)
					switch n {
					case 101:
						msg.Payload = []byte(`"` + strings.Repeat("x", maxMessageSize-1) + `"`)
						reasons[len(msgs)] = fmt.Sprintf("406 PRECONDITION_FAILED - message size %d is larger than configured max size %d", maxMessageSize+1, maxMessageSize)
					case 201:
						msg.Headers["CC"] = "not-a-list"
						reasons[len(msgs)] = `406 PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,"CC",longstr}`
					}
					msgs = append(msgs, msg)
				}
				expectOrFail(v, failed, enqueue(ctx, t, db, msgs), msgs, reasons)
			}
			checkLimitsRun(ctx, t, db, v, reg, failed, validator.AtLeastOnce)
		})
	}
}

// expectOrFail tells v to expect each enqueued message, except those with a
// reason (by index in msgs): failed gets those, by message id.
func expectOrFail(v *validator.Validator, failed map[string]string, ids []outbox.MessageID, msgs []outbox.Message, reasons map[int]string) {
	for i, msg := range msgs {
		if reason, ok := reasons[i]; ok {
			failed[ids[i].String()] = reason
		} else {
			v.Expect(expected(ids[i], msg))
		}
	}
}

// checkLimitsRun waits for every expected message and an empty outbox, then
// checks outbox_failed against failed, the deliveries in mode, and that the
// relay never reconnected to the broker.
func checkLimitsRun(ctx context.Context, t *testing.T, db *testenv.DB, v *validator.Validator, reg *prometheus.Registry, failed map[string]string, mode validator.Delivery) {
	t.Helper()
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatalf("%v (the relay reconnected to the broker %v times)", err, amqpReconnects(t, reg))
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	checkFailed(ctx, t, db, failed)
	if err := v.Check(mode); err != nil {
		t.Fatal(err)
	}
	if n := amqpReconnects(t, reg); n != 0 {
		t.Errorf("the relay reconnected to the broker %v times, want none", n)
	}
}
