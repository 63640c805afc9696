package publish

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// FuzzFromRecord feeds the headers column and the other producer-written
// fields of an outbox row to FromRecord, which turns them into the AMQP
// message. Properties: no panic; a row refused is a *BadRecordError (the
// relay moves it to outbox_failed); a row accepted has headers amqp091 can
// encode (Table.Validate) and only headers the row's JSON object had plus
// the relay's own, each row header carrying exactly the JSON value it came
// from (numbers by value); the relay's headers and properties are the
// row's. Seed corpus: testdata/fuzz/FuzzFromRecord/.
func FuzzFromRecord(f *testing.F) {
	f.Fuzz(func(t *testing.T, headers []byte, id uint64, epoch int64, replay bool,
		key, exchange, routingKey, msgType, contentType string, createdMicros int64) {
		rec := &outbox.Record{
			ID: id, MessageID: outbox.MessageID{1, 2, 3}, PartitionKey: key, Exchange: exchange,
			RoutingKey: routingKey, MessageType: msgType, Headers: headers, Payload: []byte("{}"),
			ContentType: contentType, CreatedAt: time.UnixMicro(createdMicros).UTC(),
		}
		m, err := FromRecord(rec, "default-ex", epoch, replay)
		if err != nil {
			var bad *BadRecordError
			if !errors.As(err, &bad) || bad.Reason == "" {
				t.Fatalf("refusal %v (%T) is not a *BadRecordError with a reason", err, err)
			}
			return
		}
		h := m.Publishing.Headers
		if err := h.Validate(); err != nil {
			t.Fatalf("accepted headers amqp091 cannot encode: %v", err)
		}
		relay := map[string]any{
			HeaderOutboxID: int64(id), HeaderPartitionKey: key, HeaderRelayEpoch: epoch,
			HeaderCreatedAt: FormatCreatedAt(rec.CreatedAt),
		}
		if rec.CreatedAt.IsZero() { // a zero DATETIME: no x-created-at
			relay[HeaderCreatedAt] = nil
		}
		if replay {
			relay[HeaderReplay] = true
		}
		for k, want := range relay {
			if h[k] != want {
				t.Fatalf("header %s = %#v, want %#v", k, h[k], want)
			}
		}
		for _, k := range []string{HeaderReplay, HeaderCreatedAt} {
			if _, ok := h[k]; ok && relay[k] == nil {
				t.Fatalf("header %s = %#v, want none", k, h[k])
			}
		}
		wantExchange := exchange
		if wantExchange == "" {
			wantExchange = "default-ex"
		}
		p := m.Publishing
		if m.Exchange != wantExchange || m.RoutingKey != routingKey || m.Key != key || p.Type != msgType ||
			p.ContentType != contentType || p.MessageId != rec.MessageID.String() || p.DeliveryMode != amqp.Persistent ||
			!p.Timestamp.Equal(rec.CreatedAt) || !bytes.Equal(p.Body, rec.Payload) {
			t.Fatalf("message %+v does not carry the row %+v", m, rec)
		}

		// The row's own headers: exactly the JSON object's members.
		var obj map[string]any
		if trimmed := bytes.TrimSpace(headers); len(trimmed) > 0 && !bytes.Equal(trimmed, []byte("null")) {
			dec := json.NewDecoder(bytes.NewReader(trimmed))
			dec.UseNumber()
			if err := dec.Decode(&obj); err != nil || obj == nil {
				t.Fatalf("headers %q accepted but not a JSON object: %v", headers, err)
			}
		}
		for k, v := range h {
			if _, ours := relay[k]; ours || k == HeaderReplay {
				continue
			}
			jv, ok := obj[k]
			if !ok {
				t.Fatalf("header %q is not in the row's headers %q", k, headers)
			}
			if !sameValue(jv, v) {
				t.Fatalf("header %q: JSON %#v became %#v", k, jv, v)
			}
		}
		for k := range obj {
			if _, ours := relay[k]; ours || k == HeaderReplay {
				continue
			}
			if _, ok := h[k]; !ok {
				t.Fatalf("row header %q was dropped", k)
			}
		}
	})
}

// sameValue reports whether the AMQP value a carries the decoded JSON value
// j (json.Number for numbers) exactly.
func sameValue(j, a any) bool {
	switch j := j.(type) {
	case nil:
		return a == nil
	case bool, string:
		return a == j
	case json.Number:
		if s, ok := a.(string); ok {
			return s == string(j) // the number's own text
		}
		if hugeExponent(string(j)) {
			// 10^(±10⁴ and beyond) would make the oracle itself slow: only
			// the type is checked.
			_, isInt := a.(int64)
			_, isFloat := a.(float64)
			return isInt || isFloat
		}
		want, ok := new(big.Rat).SetString(string(j))
		if !ok {
			return false
		}
		switch a := a.(type) {
		case int64:
			return want.Cmp(new(big.Rat).SetInt64(a)) == 0
		case float64:
			got, ok := new(big.Rat).SetString(strconv.FormatFloat(a, 'g', -1, 64))
			return ok && got.Cmp(want) == 0
		}
		return false
	case map[string]any:
		t, ok := a.(amqp.Table)
		if !ok || len(t) != len(j) {
			return false
		}
		for k, v := range j {
			if av, ok := t[k]; !ok || !sameValue(v, av) {
				return false
			}
		}
		return true
	case []any:
		arr, ok := a.([]any)
		if !ok || len(arr) != len(j) {
			return false
		}
		for i := range j {
			if !sameValue(j[i], arr[i]) {
				return false
			}
		}
		return true
	}
	return false
}

// hugeExponent reports whether the JSON number n has an exponent part
// beyond ±10000.
func hugeExponent(n string) bool {
	i := bytes.IndexAny([]byte(n), "eE")
	if i < 0 {
		return false
	}
	e, err := strconv.ParseInt(n[i+1:], 10, 64)
	return err != nil || e > 10000 || e < -10000
}
