package publish

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// rabbitFrameMax is RabbitMQ's default frame_max, which the shared broker
// keeps.
const rabbitFrameMax = 131072

// A message that makes the broker close the whole connection, whatever
// the check before sending missed (switched off here: its content-header
// frame of 300 KiB is over frame_max), is found among the 300 messages of
// ten keys on two Channels that were on the wire with it and resolved
// Returned after MaxAttempts closures while it alone was on the wire; the
// reconnects stay at MaxAttempts and one more, the message is named in the
// log once with the count, and everything else (one exactly at frame_max
// among them) arrives in order per key.
func TestConnectionClosingMessageIsFound(t *testing.T) {
	t.Parallel()
	b := testenv.RabbitMQ(t)
	v := validator.New()
	stopConsume, err := validator.Consume(context.Background(), b.URL, b.Queue, v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopConsume)
	core, logs := observer.New(zapcore.InfoLevel)
	const maxAttempts = 3
	var reconnects atomic.Int32
	ctx := testenv.Context(t, time.Minute)
	p, err := New(ctx, Config{
		URL: b.URL, MaxAttempts: maxAttempts, NackGiveUp: time.Millisecond, Logger: zap.New(core),
		OnReconnect: func(string) { reconnects.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.noSizeCheck = true

	var mu sync.Mutex
	results := map[uint64]Result{}
	onResult := func(r Result) {
		mu.Lock()
		results[r.Tag.(uint64)] = r
		mu.Unlock()
	}
	var chans [2]*Channel
	for i := range chans {
		if chans[i], err = p.NewChannel(onResult); err != nil {
			t.Fatal(err)
		}
	}
	const total, culprit, atLimit = 302, 150, 151
	for id := uint64(1); id <= total; id++ {
		rec := blameRecord(t, id, b.Exchange)
		switch id {
		case culprit:
			padHeaders(t, rec, 300<<10)
		case atLimit:
			padHeaders(t, rec, rabbitFrameMax)
		}
		m, err := FromRecord(rec, "", 7, false)
		if err != nil {
			t.Fatal(err)
		}
		m.Tag = id
		if id != culprit {
			var headers map[string]any
			if err := json.Unmarshal(rec.Headers, &headers); err != nil {
				t.Fatal(err)
			}
			v.Expect(validator.Expected{ID: rec.MessageID, PartitionKey: rec.PartitionKey, Exchange: rec.Exchange,
				RoutingKey: rec.RoutingKey, MessageType: rec.MessageType, Payload: rec.Payload, Headers: headers,
				CreatedAt: rec.CreatedAt})
		}
		if err := chans[id%2].Publish(ctx, m); err != nil {
			t.Fatalf("publish %d: %v", id, err)
		}
	}
	for _, c := range chans {
		if err := c.Flush(ctx); err != nil {
			t.Fatalf("flush: %v (%d reconnects)", err, reconnects.Load())
		}
	}
	if err := v.WaitComplete(ctx); err != nil {
		outcomes := map[string]int{}
		for _, r := range results {
			outcomes[fmt.Sprintf("%v %d %.60s", r.Outcome, r.Code, r.Reason)]++
		}
		t.Fatalf("%v; results %v; %d reconnects", err, outcomes, reconnects.Load())
	}
	for id := uint64(1); id <= total; id++ {
		r := results[id]
		switch {
		case id == culprit:
			want := fmt.Sprintf("closed the connection %d times over ", maxAttempts)
			if r.Outcome != Returned || r.Code != 501 || !strings.Contains(r.Reason, want) ||
				!strings.Contains(r.Reason, "while this message alone was on the wire: 501 FRAME_ERROR") {
				t.Errorf("the message over frame_max: %v %d %q, want returned 501 with %q", r.Outcome, r.Code, r.Reason, want)
			}
		case r.Outcome != Confirmed:
			t.Errorf("message %d: %v %d %q, want confirmed", id, r.Outcome, r.Code, r.Reason)
		}
	}
	// A message confirmed before the closure whose confirm was lost is
	// published again: duplicates are allowed, gaps and reordering not.
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	if n := reconnects.Load(); n < maxAttempts || n > maxAttempts+1 {
		t.Errorf("%d reconnects, want %d or %d", n, maxAttempts, maxAttempts+1)
	}
	if n := logs.FilterMessageSnippet("closed the AMQP connection every time").Len(); n != 1 {
		t.Errorf("the message that closed the connection is named %d times in the log, want once", n)
	}
}

// blameRecord is row id of a workload of ten keys.
func blameRecord(t *testing.T, id uint64, exchange string) *outbox.Record {
	t.Helper()
	var mid outbox.MessageID
	binary.BigEndian.PutUint64(mid[0:8], uint64(time.Now().UnixNano()))
	binary.BigEndian.PutUint64(mid[8:16], id)
	return &outbox.Record{
		ID: id, MessageID: mid, PartitionKey: fmt.Sprintf("key-%d", id%10), Exchange: exchange,
		RoutingKey: fmt.Sprintf("rk.%d", id%10), MessageType: "test.event",
		Headers: []byte(fmt.Sprintf(`{"n":%d}`, id)), Payload: []byte(fmt.Sprintf(`{"id":%d}`, id)),
		ContentType: "application/json", CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}
}

// padHeaders adds a "pad" header to rec so that its message's
// content-header frame is size bytes.
func padHeaders(t *testing.T, rec *outbox.Record, size int) {
	t.Helper()
	frame := func(pad int) int {
		rec.Headers = []byte(fmt.Sprintf(`{"n":%d,"pad":"%s"}`, rec.ID, strings.Repeat("p", pad)))
		m, err := FromRecord(rec, "", 7, false)
		if err != nil {
			t.Fatal(err)
		}
		return HeaderFrameSize(&m.Publishing)
	}
	if got := frame(size - frame(0)); got != size {
		t.Fatalf("padded header frame is %d bytes, want %d", got, size)
	}
}
