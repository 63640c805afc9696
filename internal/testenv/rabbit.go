package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/redact"
)

const amqpDialTimeout = 5 * time.Second

// Broker is the test's own durable topic exchange and durable queue, bound
// with "#" so the queue receives everything published to the exchange.
type Broker struct {
	URL      string // AMQP URL of the broker
	Exchange string // durable topic exchange, deleted at cleanup
	Queue    string // durable queue bound to Exchange with "#", deleted at cleanup

	node *RabbitNode // the private node it lives on (RabbitNode.Broker), nil on the shared broker
}

// RabbitMQ gives the test its own durable topic exchange and durable queue
// bound with "#", with unique names derived from the test name; both are
// deleted at cleanup. The broker is OUTBOX_TEST_AMQP_URL or DefaultAMQPURL.
// When it cannot be reached the test is skipped, or fails under Require.
func RabbitMQ(t testing.TB) *Broker {
	t.Helper()
	url := os.Getenv(EnvAMQPURL)
	if url == "" {
		url = DefaultAMQPURL
	}
	conn, err := dialAMQP(url)
	if err != nil {
		unavailable(t, "RabbitMQ at %s unreachable: %v", redact.URL(url), err)
	}
	defer conn.Close()
	return newBroker(t, conn, url, nil)
}

// newBroker declares the test's exchange and queue over conn and registers
// their deletion at cleanup. A broker on a private node (node set) is left
// alone at cleanup: the node and its data go away with the test, and it may
// well be stopped by then.
func newBroker(t testing.TB, conn *amqp.Connection, url string, node *RabbitNode) *Broker {
	t.Helper()
	b := &Broker{URL: url, Exchange: objectName(t.Name(), "test.", ".", 200), node: node}
	b.Queue = b.Exchange

	err := withChannel(conn, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(b.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", b.Exchange, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if err := b.cleanup(func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(b.Queue, false, false, false)
			if err != nil {
				return fmt.Errorf("delete queue %s: %w", b.Queue, err)
			}
			return nil
		}); err != nil {
			t.Errorf("testenv: %v", err)
		}
		if err := b.cleanup(func(ch *amqp.Channel) error {
			if err := ch.ExchangeDelete(b.Exchange, false, false); err != nil {
				return fmt.Errorf("delete exchange %s: %w", b.Exchange, err)
			}
			return nil
		}); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	if err := withChannel(conn, func(ch *amqp.Channel) error { return declareBoundQueue(ch, b.Queue, b.Exchange, "#") }); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return b
}

// DeclareQueue declares another durable queue bound to b.Exchange with
// routingKey (a topic pattern) and returns its name; it is deleted at cleanup.
func (b *Broker) DeclareQueue(t testing.TB, routingKey string) string {
	t.Helper()
	conn, err := dialAMQP(b.URL)
	if err != nil {
		t.Fatalf("testenv: connect to RabbitMQ at %s: %v", redact.URL(b.URL), err)
	}
	defer conn.Close()
	name := objectName(t.Name()+"."+routingKey, "test.", ".", 200)
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
	if err := withChannel(conn, func(ch *amqp.Channel) error { return declareBoundQueue(ch, name, b.Exchange, routingKey) }); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return name
}

func declareBoundQueue(ch *amqp.Channel, queue, exchange, key string) error {
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", queue, err)
	}
	if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s to %s with %q: %w", queue, exchange, key, err)
	}
	return nil
}

// cleanup runs f on a connection of its own: the test may have closed or
// broken every connection it had.
func (b *Broker) cleanup(f func(*amqp.Channel) error) error {
	if b.node != nil {
		return nil // removed with the node's directory
	}
	conn, err := dialAMQP(b.URL)
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ at %s for cleanup: %w", redact.URL(b.URL), err)
	}
	defer conn.Close()
	return withChannel(conn, f)
}

// A connection the broker does not complete within amqpDialTimeout is tried
// again until progress.Patience has passed: a broker slowed by a busy
// machine answers late, it is not down. A refused connection or a refusal
// by the broker is returned at once.
func dialAMQP(url string) (*amqp.Connection, error) {
	deadline := time.Now().Add(progress.Patience)
	for {
		conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(amqpDialTimeout)})
		if err == nil || !timedOut(err) || time.Now().After(deadline) {
			return conn, err
		}
	}
}

// timedOut tells whether err is a network timeout (amqp091 reports one met
// during the handshake as a 501 error carrying the message only).
func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || strings.Contains(err.Error(), "i/o timeout")
}

// withChannel runs f on a new channel. A channel error closes the channel, so
// each step gets its own.
func withChannel(conn *amqp.Connection, f func(*amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open AMQP channel: %w", err)
	}
	defer ch.Close()
	return f(ch)
}
