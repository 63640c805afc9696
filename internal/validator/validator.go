package validator

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Expected is a committed message as its producer wrote it.
type Expected struct {
	ID           outbox.MessageID
	PartitionKey string
	Exchange     string // the exchange the relay should publish to (after defaulting)
	RoutingKey   string
	MessageType  string
	ContentType  string
	Payload      []byte
	Headers      map[string]any // the row's headers as the producer gave them
}

// Validator collects expectations and deliveries; safe for concurrent use.
// Deliveries may arrive before their expectation is registered (the server
// ships a binlog event before the producer's commit returns), so checks run
// over everything at the end.
type Validator struct {
	mu          sync.Mutex
	expected    map[outbox.MessageID]*Expected
	order       map[string][]outbox.MessageID // per partition, commit order
	deliveries  []amqp.Delivery
	counts      map[string]int // by message-id text
	firstByPart map[string][]string
}

// New returns an empty validator.
func New() *Validator {
	return &Validator{
		expected:    map[outbox.MessageID]*Expected{},
		order:       map[string][]outbox.MessageID{},
		counts:      map[string]int{},
		firstByPart: map[string][]string{},
	}
}

// Expect registers committed messages. For each partition, call it in
// commit order (tests give each partition to one producer, whose commits
// are sequential). Messages with an empty partition key carry no order.
func (v *Validator) Expect(msgs ...Expected) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range msgs {
		m := msgs[i]
		v.expected[m.ID] = &m
		if m.PartitionKey != "" {
			v.order[m.PartitionKey] = append(v.order[m.PartitionKey], m.ID)
		}
	}
}

// Observe records one delivery.
func (v *Validator) Observe(d amqp.Delivery) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.deliveries = append(v.deliveries, d)
	v.counts[d.MessageId]++
	if v.counts[d.MessageId] == 1 {
		pk, _ := d.Headers["x-partition-key"].(string)
		v.firstByPart[pk] = append(v.firstByPart[pk], d.MessageId)
	}
}

// Missing is how many expected messages have not arrived yet.
func (v *Validator) Missing() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for id := range v.expected {
		if v.counts[id.String()] == 0 {
			n++
		}
	}
	return n
}

// Received is the number of deliveries so far, duplicates included.
func (v *Validator) Received() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.deliveries)
}

// Duplicates is how many deliveries repeated an earlier one.
func (v *Validator) Duplicates() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.deliveries) - len(v.counts)
}

// WaitComplete waits until every expected message has arrived, or ctx ends;
// the error then says how many are missing.
func (v *Validator) WaitComplete(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		missing := v.Missing()
		if missing == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d expected messages never arrived (%d deliveries): %w",
				missing, v.expectedCount(), v.Received(), ctx.Err())
		case <-t.C:
		}
	}
}

func (v *Validator) expectedCount() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.expected)
}

// Delivery says how often each message may arrive.
type Delivery int

const (
	ExactlyOnce Delivery = iota // no duplicates allowed
	AtLeastOnce                 // duplicates allowed, never a gap
)

// Check returns every violation found, nil when all hold: completeness,
// nothing unexpected, duplicates per mode, first deliveries in commit order
// per partition, properties equal to the rows.
func (v *Validator) Check(mode Delivery) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	var problems []string
	add := func(format string, a ...any) {
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, a...))
		}
	}
	for id := range v.expected {
		if v.counts[id.String()] == 0 {
			add("message %s never arrived", id)
		}
	}
	for _, d := range v.deliveries {
		id, err := outbox.ParseMessageID(d.MessageId)
		exp := v.expected[id]
		if err != nil || exp == nil {
			add("unexpected delivery with message-id %q", d.MessageId)
			continue
		}
		if msg := compare(exp, d); msg != "" {
			add("message %s: %s", exp.ID, msg)
		}
	}
	if dups := len(v.deliveries) - len(v.counts); mode == ExactlyOnce && dups > 0 {
		add("%d duplicate deliveries where exactly once was expected", dups)
	}
	for pk, want := range v.order {
		got := v.firstByPart[pk]
		if len(got) != len(want) {
			continue // incompleteness is reported above
		}
		for i := range want {
			if got[i] != want[i].String() {
				add("partition %q: first delivery #%d is %s, commit order says %s", pk, i, got[i], want[i])
				break
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	sort.Strings(problems[1:])
	return fmt.Errorf("%d deliveries of %d expected messages:\n  %s", len(v.deliveries), len(v.expected),
		strings.Join(problems, "\n  "))
}

// compare checks one delivery against its row per design §3.
func compare(exp *Expected, d amqp.Delivery) string {
	var bad []string
	if !bytes.Equal(d.Body, exp.Payload) {
		bad = append(bad, fmt.Sprintf("body differs (%d bytes, want %d)", len(d.Body), len(exp.Payload)))
	}
	if d.Exchange != exp.Exchange || d.RoutingKey != exp.RoutingKey {
		bad = append(bad, fmt.Sprintf("published to %q/%q, want %q/%q", d.Exchange, d.RoutingKey, exp.Exchange, exp.RoutingKey))
	}
	if d.Type != exp.MessageType {
		bad = append(bad, fmt.Sprintf("type %q, want %q", d.Type, exp.MessageType))
	}
	wantCT := exp.ContentType
	if wantCT == "" {
		wantCT = "application/json"
	}
	if d.ContentType != wantCT {
		bad = append(bad, fmt.Sprintf("content-type %q, want %q", d.ContentType, wantCT))
	}
	if d.DeliveryMode != amqp.Persistent {
		bad = append(bad, fmt.Sprintf("delivery mode %d, want persistent", d.DeliveryMode))
	}
	if d.Timestamp.IsZero() {
		bad = append(bad, "no timestamp")
	}
	if pk, _ := d.Headers["x-partition-key"].(string); pk != exp.PartitionKey {
		bad = append(bad, fmt.Sprintf("x-partition-key %q, want %q", pk, exp.PartitionKey))
	}
	if _, ok := d.Headers["x-outbox-id"].(int64); !ok {
		bad = append(bad, fmt.Sprintf("x-outbox-id is %T, want int64", d.Headers["x-outbox-id"]))
	}
	if _, ok := d.Headers["x-relay-epoch"].(int64); !ok {
		bad = append(bad, fmt.Sprintf("x-relay-epoch is %T, want int64", d.Headers["x-relay-epoch"]))
	}
	if _, ok := d.Headers["x-replay"]; ok {
		bad = append(bad, "x-replay set on a live delivery")
	}
	for k := range d.Headers {
		switch k {
		case "x-outbox-id", "x-partition-key", "x-relay-epoch":
			continue
		}
		if _, ok := exp.Headers[k]; !ok {
			bad = append(bad, fmt.Sprintf("unexpected header %q", k))
		}
	}
	for k, want := range exp.Headers {
		got, ok := d.Headers[k]
		if !ok {
			bad = append(bad, fmt.Sprintf("header %q missing", k))
			continue
		}
		if !sameValue(got, want) {
			bad = append(bad, fmt.Sprintf("header %q = %v (%T), want %v (%T)", k, got, got, want, want))
		}
	}
	return strings.Join(bad, "; ")
}

// sameValue compares a header as AMQP carried it with the producer's value:
// numbers compare by value whatever their Go type.
func sameValue(got, want any) bool {
	if g, ok := toFloat(got); ok {
		w, ok := toFloat(want)
		return ok && g == w
	}
	return got == want
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case int:
		return float64(n), true
	case int8:
		return float64(n), true
	case int16:
		return float64(n), true
	case int32:
		return float64(n), true
	case int64:
		return float64(n), true
	case uint8:
		return float64(n), true
	case uint16:
		return float64(n), true
	case uint32:
		return float64(n), true
	case uint64:
		return float64(n), true
	case float32:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}
