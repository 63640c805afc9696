package validator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/progress"
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
	// CreatedAt is the row's created_at when the test knows it; zero
	// checks only that x-created-at and the timestamp agree.
	CreatedAt time.Time
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
	arrived     []time.Time    // when each of deliveries arrived
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
	v.arrived = append(v.arrived, time.Now())
	v.counts[d.MessageId]++
	if v.counts[d.MessageId] == 1 {
		pk, _ := d.Headers["x-partition-key"].(string)
		v.firstByPart[pk] = append(v.firstByPart[pk], d.MessageId)
	}
}

// Deliveries returns a copy of every delivery observed so far, in arrival
// order.
func (v *Validator) Deliveries() []amqp.Delivery {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.deliveries)
}

// Arrivals returns when each delivery of Deliveries arrived, in the same
// order.
func (v *Validator) Arrivals() []time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.arrived)
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

// Unexpected is how many deliveries carry a message id no Expect named
// (yet): a message published that should not have been, or not yet.
func (v *Validator) Unexpected() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for _, d := range v.deliveries {
		id, err := outbox.ParseMessageID(d.MessageId)
		if err != nil || v.expected[id] == nil {
			n++
		}
	}
	return n
}

// ExpectedMessages returns the expectations registered so far, each
// partition's in the order Expect was told them: to hand them to another
// Validator once they are due (a transaction committed later).
func (v *Validator) ExpectedMessages() []Expected {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]Expected, 0, len(v.expected))
	for _, ids := range v.order {
		for _, id := range ids {
			out = append(out, *v.expected[id])
		}
	}
	for _, m := range v.expected {
		if m.PartitionKey == "" {
			out = append(out, *m)
		}
	}
	return out
}

// Duplicates is how many deliveries repeated an earlier one.
func (v *Validator) Duplicates() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.deliveries) - len(v.counts)
}

// WaitComplete waits until every expected message has arrived. It goes on as
// long as deliveries keep coming, and fails when none has come for
// progress.Patience (or ctx ends); the error then says how many are missing.
func (v *Validator) WaitComplete(ctx context.Context) error {
	err := progress.Wait(ctx, "wait for every expected message",
		func() int64 { return int64(v.Received()) }, func() bool { return v.Missing() == 0 })
	if err != nil {
		return fmt.Errorf("%d of %d expected messages never arrived (%d deliveries): %w",
			v.Missing(), v.ExpectedCount(), v.Received(), err)
	}
	return nil
}

// ExpectedCount is how many messages the validator was told to expect.
func (v *Validator) ExpectedCount() int {
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

// compare checks one delivery against its row as docs/wire.md describes.
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
	bad = append(bad, checkCreatedAt(exp, d)...)
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
		case "x-outbox-id", "x-partition-key", "x-relay-epoch", "x-created-at":
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

// createdAtLayout is x-created-at's form (docs/wire.md), written out here
// rather than taken from package publish: the validator checks the contract,
// not the code.
const createdAtLayout = "2006-01-02T15:04:05.000000Z"

// checkCreatedAt: x-created-at is a string in createdAtLayout, the timestamp
// property is that instant cut to the second, and both are the row's
// created_at when the test knows it.
func checkCreatedAt(exp *Expected, d amqp.Delivery) []string {
	s, ok := d.Headers["x-created-at"].(string)
	if !ok {
		return []string{fmt.Sprintf("x-created-at is %T, want a string", d.Headers["x-created-at"])}
	}
	at, err := time.Parse(createdAtLayout, s)
	if err != nil || at.Format(createdAtLayout) != s {
		return []string{fmt.Sprintf("x-created-at %q is not of the form %s", s, createdAtLayout)}
	}
	var bad []string
	if !d.Timestamp.Equal(at.Truncate(time.Second)) {
		bad = append(bad, fmt.Sprintf("timestamp %s is not x-created-at %s cut to the second", d.Timestamp.UTC().Format(time.RFC3339), s))
	}
	if !exp.CreatedAt.IsZero() && !at.Equal(exp.CreatedAt) {
		bad = append(bad, fmt.Sprintf("x-created-at %s, want the row's created_at %s", s, exp.CreatedAt.UTC().Format(createdAtLayout)))
	}
	return bad
}

// sameValue compares a header as AMQP carried it with the value the
// producer gave, as docs/wire.md describes: a number is an int64 when it is an
// integer in int64's range, else a double with its value, else a string of
// its decimal text with its value; nil is void; maps and slices are tables
// and arrays compared member by member.
func sameValue(got, want any) bool {
	if w, ok := toRat(want); ok {
		fitsInt64 := w.IsInt() && w.Num().IsInt64()
		switch g := got.(type) {
		case int64:
			return fitsInt64 && w.Cmp(new(big.Rat).SetInt64(g)) == 0
		case float64:
			short, _ := new(big.Rat).SetString(strconv.FormatFloat(g, 'g', -1, 64))
			return !fitsInt64 && short != nil && short.Cmp(w) == 0
		case string:
			r, ok := new(big.Rat).SetString(g)
			return !fitsInt64 && ok && r.Cmp(w) == 0
		}
		return false
	}
	switch w := want.(type) {
	case nil:
		return got == nil
	case map[string]any:
		g, ok := got.(amqp.Table)
		if !ok || len(g) != len(w) {
			return false
		}
		for k, wv := range w {
			if gv, ok := g[k]; !ok || !sameValue(gv, wv) {
				return false
			}
		}
		return true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !sameValue(g[i], w[i]) {
				return false
			}
		}
		return true
	}
	return got == want
}

// toRat returns a producer's number exactly; ok is false for non-numbers.
// A float64 is taken as the decimal json.Marshal writes for it (its
// shortest form), which is what the row holds.
func toRat(v any) (*big.Rat, bool) {
	var s string
	switch n := v.(type) {
	case int:
		s = strconv.FormatInt(int64(n), 10)
	case int8:
		s = strconv.FormatInt(int64(n), 10)
	case int16:
		s = strconv.FormatInt(int64(n), 10)
	case int32:
		s = strconv.FormatInt(int64(n), 10)
	case int64:
		s = strconv.FormatInt(n, 10)
	case uint:
		s = strconv.FormatUint(uint64(n), 10)
	case uint8:
		s = strconv.FormatUint(uint64(n), 10)
	case uint16:
		s = strconv.FormatUint(uint64(n), 10)
	case uint32:
		s = strconv.FormatUint(uint64(n), 10)
	case uint64:
		s = strconv.FormatUint(n, 10)
	case float32:
		s = strconv.FormatFloat(float64(n), 'g', -1, 32)
	case float64:
		s = strconv.FormatFloat(n, 'g', -1, 64)
	case json.Number:
		s = string(n)
	default:
		return nil, false
	}
	r, ok := new(big.Rat).SetString(s)
	return r, ok
}

// Clone returns a validator expecting what v expects, with no deliveries:
// for a second queue bound to the same exchange, which must receive every
// message too.
func (v *Validator) Clone() *Validator {
	v.mu.Lock()
	defer v.mu.Unlock()
	c := New()
	for id, e := range v.expected {
		c.expected[id] = e
	}
	for k, ids := range v.order {
		c.order[k] = slices.Clone(ids)
	}
	return c
}

// DuplicatedMessages is how many different messages arrived more than once
// (Duplicates counts the extra deliveries).
func (v *Validator) DuplicatedMessages() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for _, c := range v.counts {
		if c > 1 {
			n++
		}
	}
	return n
}
