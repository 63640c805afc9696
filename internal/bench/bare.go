package bench

import (
	"context"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// PublishBare is the ceiling the relay is measured against: amqp091 alone,
// no retention, returns or reconnects. It publishes total messages,
// mandatory, to exchange with routing key key over channels confirm-mode
// channels of conn (message i on channel i % channels), each with at most
// window unconfirmed, and returns when every one is confirmed, or the first
// error (a nack included). msg(i) is the i-th message.
func PublishBare(ctx context.Context, conn *amqp.Connection, exchange, key string, channels, total, window int,
	msg func(i int) amqp.Publishing) error {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	for c := range channels {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("bare publisher: open channel: %w", err)
		}
		if err := ch.Confirm(false); err != nil {
			ch.Close()
			return fmt.Errorf("bare publisher: confirm mode: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer ch.Close()
			if err := publishOn(ctx, ch, exchange, key, c, channels, total, window, msg); err != nil {
				fail(fmt.Errorf("bare publisher channel %d: %w", c, err))
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// publishOn publishes messages c, c+step, c+2*step … below total on ch.
func publishOn(ctx context.Context, ch *amqp.Channel, exchange, key string, c, step, total, window int,
	msg func(i int) amqp.Publishing) error {
	unconfirmed := make(chan *amqp.DeferredConfirmation, window)
	wait := func() error {
		ok, err := (<-unconfirmed).WaitContext(ctx)
		if err == nil && !ok {
			err = fmt.Errorf("broker nacked a message")
		}
		return err
	}
	for i := c; i < total; i += step {
		if len(unconfirmed) == cap(unconfirmed) {
			if err := wait(); err != nil {
				return err
			}
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg(i))
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		unconfirmed <- dc
	}
	for len(unconfirmed) > 0 {
		if err := wait(); err != nil {
			return err
		}
	}
	return nil
}
