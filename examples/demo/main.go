package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/outbox"
)

func main() {
	var (
		dsn         = flag.String("mysql-dsn", "root@tcp(127.0.0.1:3307)/demo", "database holding the outbox and the inbox")
		amqpURL     = flag.String("amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ")
		exchange    = flag.String("exchange", "outbox-demo", "exchange the relay publishes to (its --default-exchange)")
		count       = flag.Int("count", 100, "messages to send before stopping")
		rate        = flag.Float64("rate", 20, "messages per second")
		replayEvery = flag.Int("replay-every", 10, "publish a copy of every Nth message received, for the inbox to skip; 0: none")
		wait        = flag.Duration("wait", 30*time.Second, "how long to wait for the last messages after sending")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dsn, *amqpURL, *exchange, *count, *rate, *replayEvery, *wait); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn, amqpURL, exchange string, count int, rate float64, replayEvery int, wait time.Duration) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS demo_order_updates (
		id         BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
		message_id BINARY(16)   NOT NULL,
		order_no   INT          NOT NULL,
		step       INT          NOT NULL
	) ENGINE=InnoDB`); err != nil {
		return fmt.Errorf("create demo_order_updates: %w", err)
	}
	effectsBefore, err := countEffects(ctx, db)
	if err != nil {
		return err
	}

	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	queue, err := declare(conn, exchange)
	if err != nil {
		return err
	}
	c, err := startConsumer(ctx, db, conn, queue, replayEvery)
	if err != nil {
		return err
	}

	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	sent := 0
	for sent < count && ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-tick.C:
		}
		if err := produce(ctx, db, c, sent); err != nil {
			c.stop()
			return err
		}
		sent++
	}

	// Wait until every message sent was processed and every copy skipped.
	deadline := time.After(wait)
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	var waitErr error
wait:
	for !c.finished(sent) {
		select {
		case <-ctx.Done():
			break wait
		case <-deadline:
			s := c.consumer.Stats()
			waitErr = fmt.Errorf("%d of %d messages were not processed within %s: is the relay running? (see .demo/relay.log)",
				sent-int(s.Processed), sent, wait)
			break wait
		case <-poll.C:
		case err := <-c.done:
			c.done <- err
			break wait
		}
	}
	if err := c.stop(); err != nil {
		return err
	}
	effectsAfter, err := countEffects(context.WithoutCancel(ctx), db)
	if err != nil {
		return err
	}
	c.summary(sent, effectsAfter-effectsBefore)
	return waitErr
}

// declare makes the demo's exchange and a private queue bound to all of it.
func declare(conn *amqp.Connection, exchange string) (string, error) {
	ch, err := conn.Channel()
	if err != nil {
		return "", fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		return "", fmt.Errorf("declare exchange %s: %w", exchange, err)
	}
	// Exclusive to this connection: gone when the demo ends.
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return "", fmt.Errorf("declare queue: %w", err)
	}
	if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
		return "", fmt.Errorf("bind queue: %w", err)
	}
	return q.Name, nil
}

// produce writes message number step into the outbox, in a transaction of
// its own. The latency clock starts before the commit: the relay may deliver
// the message before Commit returns (the server ships the binlog event
// first).
func produce(ctx context.Context, db *sql.DB, c *consumer, step int) error {
	order := step % 5
	body, _ := json.Marshal(map[string]any{"order": order, "step": step})
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() // no-op after Commit
	ids, err := outbox.Enqueue(ctx, tx, outbox.Message{
		PartitionKey: fmt.Sprintf("order-%d", order), RoutingKey: "orders.updated",
		MessageType: "order.updated", Headers: map[string]any{"step": step}, Payload: body,
	})
	if err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	c.committing(ids[0].String())
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// countEffects counts the consumer's business writes.
func countEffects(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM demo_order_updates").Scan(&n); err != nil {
		return 0, fmt.Errorf("count demo_order_updates: %w", err)
	}
	return n, nil
}
