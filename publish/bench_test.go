package publish_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/bench"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// benchBody is a 256-byte payload.
var benchBody = []byte(fmt.Sprintf("%0256d", 0))

// split gives channel i of n its share of total messages.
func split(total, n, i int) int {
	share := total / n
	if i < total%n {
		share++
	}
	return share
}

// BenchmarkPublish: confirmed persistent 256-byte messages per second into
// one durable queue, window 256, over N Channels of one Publisher, the
// messages of each Channel spread over K partition keys of its own (keys=0:
// no key, nothing is held back; keys=1: one hot key, one message per confirm
// round trip).
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{1, 4} {
		for _, k := range []int{0, 1, 64} {
			b.Run(fmt.Sprintf("channels=%d/keys=%d", n, k), func(b *testing.B) {
				benchPublish(b, n, k)
			})
		}
	}
}

func benchPublish(b *testing.B, n, k int) {
	broker := testenv.RabbitMQ(b)
	p := newPublisher(b, broker.URL, func(c *publish.Config) { c.ConfirmWindow = 256 })
	chans := make([]*publish.Channel, n)
	for i := range chans {
		c, err := p.NewChannel(func(publish.Result) {})
		if err != nil {
			b.Fatal(err)
		}
		chans[i] = c
	}
	ctx := context.Background()
	m := publish.Message{Exchange: broker.Exchange, RoutingKey: "bench",
		Publishing: amqp.Publishing{DeliveryMode: amqp.Persistent, Body: benchBody}}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range chans {
		keys := make([]string, k)
		for j := range keys {
			keys[j] = fmt.Sprintf("c%d-k%d", i, j)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := m
			for j := range split(b.N, n, i) {
				if k > 0 {
					m.Key = keys[j%k]
				}
				if err := c.Publish(ctx, m); err != nil {
					b.Error(err)
					return
				}
			}
			if err := c.Flush(ctx); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkBareAMQP is the same load with amqp091 alone (bench.PublishBare):
// confirm mode, at most 256 unconfirmed messages per channel, no retention,
// returns or reconnects.
func BenchmarkBareAMQP(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("channels=%d", n), func(b *testing.B) {
			broker := testenv.RabbitMQ(b)
			conn, err := amqp.Dial(broker.URL)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			b.ResetTimer()
			start := time.Now()
			err = bench.PublishBare(context.Background(), conn, broker.Exchange, "bench", n, b.N, 256, func(int) amqp.Publishing {
				return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: benchBody}
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}
