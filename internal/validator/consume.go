package validator

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Consume feeds every delivery of queue to v until ctx ends; it returns once
// the consumer is registered. The returned function stops it and waits.
func Consume(ctx context.Context, url, queue string, v *Validator) (stop func(), err error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("validator: connect to RabbitMQ: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("validator: open channel: %w", err)
	}
	if err := ch.Qos(1000, 0, false); err != nil {
		conn.Close()
		return nil, fmt.Errorf("validator: set prefetch: %w", err)
	}
	deliveries, err := ch.Consume(queue, "", false, true, false, false, nil)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("validator: consume %q: %w", queue, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case d, ok := <-deliveries:
				if !ok {
					return
				}
				v.Observe(d)
				_ = d.Ack(false)
			}
		}
	}()
	return func() {
		cancel()
		conn.Close()
		<-done
	}, nil
}
