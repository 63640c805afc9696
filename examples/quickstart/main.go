package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	amqpURL := flag.String("amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ")
	exchange := flag.String("exchange", "events", "exchange to declare (the relay's --default-exchange)")
	queue := flag.String("queue", "events-quickstart", "queue to declare and bind with routing key #")
	count := flag.Int("count", 1, "messages to print before stopping")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *amqpURL, *exchange, *queue, *count); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// run declares exchange and queue, binds them, and prints count messages.
func run(ctx context.Context, url, exchange, queue string, count int) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ (check --amqp-url): %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %q: %w", exchange, err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %q: %w", queue, err)
	}
	if err := ch.QueueBind(queue, "#", exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %q to exchange %q: %w", queue, exchange, err)
	}
	msgs, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume from %q: %w", queue, err)
	}
	fmt.Printf("exchange %q and queue %q ready; waiting for %d message(s)\n", exchange, queue, count)
	for seen := 0; seen < count; seen++ {
		select {
		case d, ok := <-msgs:
			if !ok {
				return fmt.Errorf("the broker closed the consumer of %q", queue)
			}
			fmt.Printf("received message-id=%s routing-key=%s type=%s body=%s\n", d.MessageId, d.RoutingKey, d.Type, d.Body)
			if err := d.Ack(false); err != nil {
				return fmt.Errorf("ack: %w", err)
			}
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}
