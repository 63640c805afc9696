// Command demo is the producer and consumer half of `make demo`: it declares
// an exchange and a queue, writes messages into the outbox at a steady rate
// (each in its own transaction, as an application would), and prints every
// message the relay delivers with its commit → receive latency. It stops by
// itself after -count messages, or on Ctrl-C, and prints a summary.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/outbox"
)

func main() {
	var (
		dsn      = flag.String("mysql-dsn", "root@tcp(127.0.0.1:3307)/demo", "database holding the outbox")
		amqpURL  = flag.String("amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ")
		exchange = flag.String("exchange", "outbox-demo", "exchange the relay publishes to (its --default-exchange)")
		count    = flag.Int("count", 100, "messages to send before stopping")
		rate     = flag.Float64("rate", 20, "messages per second")
		wait     = flag.Duration("wait", 30*time.Second, "how long to wait for the last messages after sending")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dsn, *amqpURL, *exchange, *count, *rate, *wait); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn, amqpURL, exchange string, count int, rate float64, wait time.Duration) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer db.Close()

	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", exchange, err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return fmt.Errorf("declare queue: %w", err)
	}
	if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue: %w", err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}

	var (
		mu        sync.Mutex
		committed = map[string]time.Time{} // message id → when the commit returned
		latencies []time.Duration
	)
	received := make(chan struct{}, count)
	go func() {
		for d := range deliveries {
			now := time.Now()
			mu.Lock()
			sent, ok := committed[d.MessageId]
			mu.Unlock()
			// Without a recorded commit (a message from an earlier run),
			// fall back to created_at: the AMQP timestamp, whole seconds.
			lat := now.Sub(sent)
			if !ok {
				lat = now.Sub(d.Timestamp)
			}
			mu.Lock()
			latencies = append(latencies, lat)
			mu.Unlock()
			fmt.Printf("received %-14s key=%-10s id=%s latency=%6.2fms body=%s\n",
				d.Type, d.Headers["x-partition-key"], d.MessageId, float64(lat.Microseconds())/1000, d.Body)
			received <- struct{}{}
		}
	}()

	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	sent := 0
	for sent < count {
		select {
		case <-ctx.Done():
			return summary(latencies, &mu, sent)
		case <-tick.C:
		}
		order := sent % 5
		body, _ := json.Marshal(map[string]any{"order": order, "step": sent})
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		ids, err := outbox.Enqueue(ctx, tx, outbox.Message{
			PartitionKey: fmt.Sprintf("order-%d", order), RoutingKey: "orders.updated",
			MessageType: "order.updated", Headers: map[string]any{"step": sent}, Payload: body,
		})
		if err != nil {
			tx.Rollback()
			return fmt.Errorf("enqueue: %w", err)
		}
		// The relay may deliver the message before Commit returns (the server
		// ships the binlog event first), so latency counts from the moment
		// the commit starts, recorded before the consumer can look it up.
		mu.Lock()
		committed[ids[0].String()] = time.Now()
		mu.Unlock()
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		sent++
	}
	deadline := time.After(wait)
	for got := 0; got < sent; got++ {
		select {
		case <-received:
		case <-deadline:
			return fmt.Errorf("%d of %d messages did not arrive within %s: is the relay running? (see .demo/relay.log)", sent-got, sent, wait)
		case <-ctx.Done():
			return summary(latencies, &mu, sent)
		}
	}
	return summary(latencies, &mu, sent)
}

func summary(latencies []time.Duration, mu *sync.Mutex, sent int) error {
	mu.Lock()
	defer mu.Unlock()
	l := slices.Clone(latencies)
	slices.Sort(l)
	if len(l) == 0 {
		fmt.Printf("sent %d, received 0\n", sent)
		return nil
	}
	pct := func(p float64) float64 { return float64(l[int(p*float64(len(l)-1))].Microseconds()) / 1000 }
	fmt.Printf("sent %d, received %d; commit → receive latency p50 %.2fms p99 %.2fms max %.2fms\n",
		sent, len(l), pct(0.5), pct(0.99), pct(1))
	return nil
}
