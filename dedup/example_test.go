package dedup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/dedup"
)

// The examples that need a database or a broker have no Output line: they
// are compiled, not run. The package's integration tests run the same flows
// against real MariaDB and RabbitMQ.

// Process a message once: the business write and the inbox record commit
// together, and a second delivery of the message skips the handler.
func ExampleInbox_Process() {
	ctx := context.Background()
	// The driver is registered by importing _ "github.com/go-sql-driver/mysql".
	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/billing")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	inbox := dedup.New(db, "billing")
	messageID := "0190f0e0-a1b2-7c3d-8e4f-5a6b7c8d9e01" // the delivery's MessageId
	done, err := inbox.Process(ctx, messageID, "order.placed", func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO invoices (order_id, total_cents) VALUES (?, ?)", 42, 1999)
		return err
	})
	switch {
	case err != nil:
		log.Printf("order.placed %s: %v; it will be retried", messageID, err) // nothing was recorded
	case !done:
		log.Printf("order.placed %s: processed before, skipped", messageID)
	default:
		log.Printf("order.placed %s: invoiced", messageID)
	}
}

// Consume a queue through the inbox until SIGINT or SIGTERM: a handler per
// message type, acks after the commit, at most five attempts per message.
func ExampleConsumer() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/billing")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}

	c := &dedup.Consumer{
		Inbox:    dedup.New(db, "billing"),
		Queue:    "billing.orders",
		Prefetch: 32,
		Workers:  4, // messages of one x-partition-key stay in order
		Handlers: map[string]dedup.DeliveryHandler{
			"order.placed": func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error {
				_, err := tx.ExecContext(ctx, "INSERT INTO invoices (order_json) VALUES (?)", d.Body)
				return err
			},
		},
		// Types without a handler go to outbox_failed unless Unknown is set.
		Logger: slog.Default(),
	}
	// Run returns nil once ctx ends and the handlers in flight have
	// finished; an error when the channel closed: reconnect and run again.
	if err := c.Run(ctx, ch); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%+v\n", c.Stats())
}

// A message id that is not a UUID is refused before the database is used.
func ExampleErrInvalidMessageID() {
	inbox := dedup.New(nil, "billing")
	_, err := inbox.Process(context.Background(), "order-42", "order.placed", nil)
	fmt.Println(err)
	fmt.Println(errors.Is(err, dedup.ErrInvalidMessageID))
	// Output:
	// dedup: consumer "billing": message id is not a UUID: parse message id "order-42": want 8-4-4-4-12 hex form
	// true
}

// Consume the relay's stream destination (--stream orders
// --stream-partitions 8) exactly once: run the same program in several
// processes; they share the eight partitions and take over a dead one's.
func ExampleStreamConsumer() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/billing")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri("rabbitmq-stream://app:secret@127.0.0.1:5552/"))
	if err != nil {
		log.Fatal(err)
	}
	defer env.Close()

	c := &dedup.StreamConsumer{
		Inbox:      dedup.New(db, "billing"),
		Stream:     "orders",
		Partitions: 8,
		Logger:     slog.Default(),
		Handlers: map[string]dedup.StreamHandler{
			"order.placed": func(ctx context.Context, tx *sql.Tx, m dedup.StreamMessage) error {
				// In the transaction that also stores m.Offset+1 for m.Stream.
				_, err := tx.ExecContext(ctx, "INSERT INTO invoices (order_ref, body) VALUES (?, ?)",
					m.Delivery.Headers["x-partition-key"], m.Delivery.Body)
				return err
			},
		},
	}
	if err := c.Run(ctx, env); err != nil {
		log.Fatal(err)
	}
}
