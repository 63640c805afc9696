package testenv

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// DeclareQueueArgs is DeclareQueue with queue arguments, such as a length
// limit ({"x-max-length": int64(20), "x-overflow": "reject-publish"}): a
// durable queue bound to b.Exchange with routingKey (a topic pattern), named
// after the test, deleted at cleanup. It returns the queue's name; publishing
// to the default exchange with that name as routing key reaches it too.
func (b *Broker) DeclareQueueArgs(t testing.TB, routingKey string, args amqp.Table) string {
	t.Helper()
	conn, err := dialAMQP(b.URL)
	if err != nil {
		t.Fatalf("testenv: connect to RabbitMQ at %s: %v", redact.URL(b.URL), err)
	}
	defer conn.Close()
	name := objectName(t.Name()+".args", "test.", ".", 200)
	t.Cleanup(func() {
		if err := b.cleanup(func(ch *amqp.Channel) error {
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				return fmt.Errorf("delete queue %s: %w", name, err)
			}
			return nil
		}); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	err = withChannel(conn, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %s with %v: %w", name, args, err)
		}
		if err := ch.QueueBind(name, routingKey, b.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s to %s with %q: %w", name, b.Exchange, routingKey, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return name
}

// UnbindQueue removes the binding "#" of b.Queue to b.Exchange, for a test
// that wants the exchange's messages in another queue only (a length-limited
// queue rejects a publish that b.Queue accepted, so the publisher's retries
// would fill b.Queue with copies).
func (b *Broker) UnbindQueue(t testing.TB) {
	t.Helper()
	conn, err := dialAMQP(b.URL)
	if err != nil {
		t.Fatalf("testenv: connect to RabbitMQ at %s: %v", redact.URL(b.URL), err)
	}
	defer conn.Close()
	if err := withChannel(conn, func(ch *amqp.Channel) error {
		return ch.QueueUnbind(b.Queue, "#", b.Exchange, nil)
	}); err != nil {
		t.Fatalf("testenv: unbind queue %s from %s: %v", b.Queue, b.Exchange, err)
	}
}
