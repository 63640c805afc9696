package publish

import (
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// writeLog keeps what is written to the connection under it.
type writeLog struct {
	net.Conn
	mu      sync.Mutex
	written []byte
}

func (w *writeLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.written = append(w.written, p...)
	w.mu.Unlock()
	return w.Conn.Write(p)
}

// take returns what was written since the last take.
func (w *writeLog) take() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.written
	w.written = nil
	return b
}

// HeaderFrameSize is the size of the content-header frame amqp091 writes,
// read off the wire, for properties and headers of every type it encodes.
func TestHeaderFrameSizeIsExact(t *testing.T) {
	t.Parallel()
	b := testenv.RabbitMQ(t)
	var log *writeLog
	conn, err := dial(testenv.Context(t, time.Minute), b.URL, ConnOptions{}, "frame size test", func(c net.Conn) net.Conn {
		log = &writeLog{Conn: c}
		return log
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	full := amqp.Publishing{
		ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent, Priority: 3,
		CorrelationId: "c", ReplyTo: "r", Expiration: "60000", MessageId: "m", Timestamp: time.Now(),
		Type: "t", UserId: "guest", AppId: "a",
		Headers: amqp.Table{
			"nil": nil, "bool": true, "byte": byte(1), "int8": int8(-1), "int16": int16(2), "uint16": uint16(3),
			"int": 4, "int32": int32(5), "uint32": uint32(6), "int64": int64(7), "float32": float32(0.5),
			"float64": 0.25, "decimal": amqp.Decimal{Scale: 2, Value: 314}, "string": strings.Repeat("s", 300),
			"bytes": []byte("xyz"), "time": time.Now(),
			"array": []any{"a", int64(1), amqp.Table{"k": "v"}, []any{true}},
			"table": amqp.Table{"nested": amqp.Table{"deep": "x"}, "list": []any{}},
		},
		Body: []byte("{}"),
	}
	for name, p := range map[string]amqp.Publishing{
		"no properties":  {Body: []byte("x")},
		"every property": full,
		"empty headers":  {Headers: amqp.Table{}, MessageId: "m"},
	} {
		log.take()
		if err := ch.Publish("", "no-such-queue", false, false, p); err != nil {
			t.Fatal(err)
		}
		got := headerFrameWritten(t, log)
		if want := HeaderFrameSize(&p); got != want {
			t.Errorf("%s: amqp091 wrote a content-header frame of %d bytes, HeaderFrameSize says %d", name, got, want)
		}
	}
}

// headerFrameWritten returns the size of the content-header frame (type
// 2), overhead included, among the frames written since the last take:
// amqp091 writes and flushes a publish's frames before Publish returns.
func headerFrameWritten(t *testing.T, log *writeLog) int {
	t.Helper()
	out := log.take()
	for b := out; len(b) >= 7; {
		size := int(binary.BigEndian.Uint32(b[3:7]))
		if len(b) < 8+size {
			break
		}
		if b[0] == 2 {
			return 8 + size
		}
		b = b[8+size:]
	}
	t.Fatalf("no whole content-header frame among the %d bytes written", len(out))
	return 0
}
