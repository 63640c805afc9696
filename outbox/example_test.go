package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Enqueue inside the business transaction: the message is published if and
// only if the order is committed.
func ExampleEnqueue() {
	ctx := context.Background()
	// The driver is registered by importing _ "github.com/go-sql-driver/mysql".
	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // no-op after Commit

	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total_cents) VALUES (?, ?)", 42, 1999); err != nil {
		log.Fatal(err)
	}
	ids, err := outbox.Enqueue(ctx, tx, outbox.Message{
		PartitionKey: "order-42", // messages of one order are published in order
		Exchange:     "shop",
		RoutingKey:   "order.placed",
		MessageType:  "order.placed",
		Headers:      map[string]any{"tenant": "acme", "version": 2},
		Payload:      []byte(`{"order_id":42,"total_cents":1999}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("enqueued", ids[0])
}

// Bad input is refused before any SQL runs, naming the message and field.
func ExampleValidationError() {
	_, err := outbox.Enqueue(context.Background(), nil,
		outbox.Message{RoutingKey: "order.placed"},
		outbox.Message{RoutingKey: "order.paid", Headers: map[string]any{"x-outbox-id": 7}},
	)
	fmt.Println(err)
	fmt.Println(errors.Is(err, outbox.ErrReservedHeader), errors.Is(err, outbox.ErrBadHeaders))
	var ve *outbox.ValidationError
	if errors.As(err, &ve) {
		fmt.Println(ve.Index, ve.Field)
	}
	// Output:
	// enqueue 2 messages: message 1: Headers["x-outbox-id"]: header name is reserved: the relay sets x-outbox-*, x-relay-*, x-partition-key, x-created-at and x-replay itself
	// true true
	// 1 Headers["x-outbox-id"]
}
