package bench

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// A phase's check counts every message once and each delivery that
// repeated one, whether it arrived before the count or still waited in the
// queue: 10 messages published, then 3 of them again.
func TestConsumerCountsRepeats(t *testing.T) {
	url := testenv.RabbitMQ(t).URL
	ctx := testenv.Context(t, time.Minute)
	name := fmt.Sprintf("bench-test-%d", time.Now().UnixNano())
	c, err := newConsumer(ctx, url, publish.ConnOptions{}, name, name, "classic")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	conn, err := publish.Dial(ctx, url, publish.ConnOptions{}, "bench test publisher")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	if err := c.pause(); err != nil {
		t.Fatal(err)
	}
	const distinct, again = 10, 3
	if err := PublishBare(ctx, conn, name, "k", 1, distinct+again, 100, func(i int) amqp.Publishing {
		return amqp.Publishing{MessageId: fmt.Sprint(i % distinct), Body: []byte("x")}
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.waitDepth(ctx, distinct+again, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	c.expect(distinct)
	if err := c.resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.wait(ctx, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	n, err := c.repeats()
	if err != nil {
		t.Fatal(err)
	}
	if n != again {
		t.Errorf("%d repeated deliveries counted, want %d", n, again)
	}
	if got := c.count(); got != distinct {
		t.Errorf("%d distinct messages counted, want %d", got, distinct)
	}
}
