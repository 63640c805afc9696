package testenv_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestMySQLSharedServer(t *testing.T) {
	for _, name := range []string{"a/b c", "second"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testenv.MySQL(t)
			var got, logBin, meta, charset string
			err := db.SQL.QueryRowContext(ctx(t), "SELECT DATABASE(), @@log_bin, @@binlog_row_metadata, @@character_set_database").Scan(&got, &logBin, &meta, &charset)
			if err != nil {
				t.Fatal(err)
			}
			if got != db.Name || logBin != "1" || meta != "FULL" || charset != "utf8mb4" {
				t.Fatalf("database %q log_bin %q binlog_row_metadata %q charset %q", got, logBin, meta, charset)
			}
			t.Logf("db %s dsn %s", db.Name, db.DSN)
		})
	}
}

func TestRabbitMQRoutes(t *testing.T) {
	b := testenv.RabbitMQ(t)
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(ctx(t), b.Exchange, "a.b", true, false, amqp.Publishing{Body: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		msg, ok, err := ch.Get(b.Queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if string(msg.Body) != "hi" {
				t.Fatalf("body %q", msg.Body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("message not routed to queue")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRabbitMQDeclareQueue(t *testing.T) {
	b := testenv.RabbitMQ(t)
	q := b.DeclareQueue(t, "order.*")
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"order.placed", "invoice.sent"} {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx(t), b.Exchange, key, false, false, amqp.Publishing{Body: []byte(key)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx(t)); !ok || err != nil {
			t.Fatalf("confirm %s: %v %v", key, ok, err)
		}
	}
	// Confirmed persistent routing is done: the counts are final.
	if qi, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil || qi.Messages != 1 {
		t.Fatalf("queue %s: %+v %v", q, qi, err)
	}
	if qi, err := ch.QueueDeclarePassive(b.Queue, true, false, false, false, nil); err != nil || qi.Messages != 2 {
		t.Fatalf("queue %s: %+v %v", b.Queue, qi, err)
	}
}

func TestRabbitMQCleanupDeletes(t *testing.T) {
	var b *testenv.Broker
	var extra string
	t.Run("inner", func(t *testing.T) {
		b = testenv.RabbitMQ(t)
		extra = b.DeclareQueue(t, "x")
	})
	if b == nil {
		t.Skip("RabbitMQ unavailable")
	}
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, check := range []func(*amqp.Channel) error{
		func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(b.Exchange, "topic", true, false, false, false, nil)
		},
		func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(b.Queue, true, false, false, false, nil)
			return err
		},
		func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(extra, true, false, false, false, nil)
			return err
		},
	} {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		var amqpErr *amqp.Error
		if err := check(ch); !errors.As(err, &amqpErr) || amqpErr.Code != amqp.NotFound {
			t.Errorf("after cleanup: %v, want NOT_FOUND", err)
		}
	}
}
