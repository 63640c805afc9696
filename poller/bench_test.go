package poller_test

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/bench"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/poller"
	"github.com/outbox-relay/outbox-relay/publish"
)

const (
	benchRows       = 200_000
	benchPartitions = 1000
)

// BenchmarkDrain drains a backlog of 200,000 rows (256-byte payloads, 1,000
// partitions) into one durable queue, per iteration; msgs/s is the drain
// alone (the load is not timed). Run with -benchtime=1x -count=3.
func BenchmarkDrain(b *testing.B) {
	for _, c := range []struct{ workers, batch int }{
		{poller.DefaultWorkers, poller.DefaultBatch}, {1, 500}, {4, 500}, {8, 500}, {4, 250}, {2, 1000},
	} {
		b.Run(fmt.Sprintf("workers=%d/batch=%d", c.workers, c.batch), func(b *testing.B) {
			e := setup(b, checkpoint.Delete)
			core, logs := observer.New(zap.DebugLevel)
			p := e.poller(b, func(cfg *poller.Config) {
				cfg.Workers, cfg.Batch, cfg.Logger = c.workers, c.batch, zap.New(core)
			})
			ctx := testenv.WorkContext(b)
			total, elapsed := 0, time.Duration(0)
			for range b.N {
				b.StopTimer()
				purge(b, e.broker.URL, e.broker.Queue)
				bulkLoad(ctx, b, e.pool, benchRows, benchPartitions)
				b.StartTimer()
				start := time.Now()
				n, err := p.Drain(ctx)
				elapsed += time.Since(start)
				if err != nil || n != benchRows {
					b.Fatalf("Drain: %d, %v", n, err)
				}
				total += n
			}
			b.ReportMetric(float64(total)/elapsed.Seconds(), "msgs/s")
			var rounds, rows int64
			var claim, pub, ack time.Duration
			for _, entry := range logs.FilterMessage("poll round committed").All() {
				f := entry.ContextMap()
				rounds++
				rows += f["rows"].(int64)
				claim += f["claim"].(time.Duration)
				pub += f["publish"].(time.Duration)
				ack += f["ack"].(time.Duration)
			}
			if rounds > 0 {
				b.ReportMetric(float64(rows)/float64(rounds), "rows/round")
				b.ReportMetric(float64(claim.Milliseconds())/float64(rounds), "claim-ms/round")
				b.ReportMetric(float64(pub.Milliseconds())/float64(rounds), "publish-ms/round")
				b.ReportMetric(float64(ack.Milliseconds())/float64(rounds), "ack-ms/round")
			}
		})
	}
}

// BenchmarkBareAMQP publishes 200,000 persistent 256-byte messages per
// iteration to the same kind of durable queue with amqp091 alone: confirm
// mode, at most publish.DefaultConfirmWindow unconfirmed per channel (the
// poller's window), on 1 channel and on DefaultWorkers channels; bare
// bodies, and with the properties and headers the poller sets.
func BenchmarkBareAMQP(b *testing.B) {
	body := []byte(fmt.Sprintf("%0256d", 0))
	for _, c := range []struct {
		n     int
		props bool
	}{{1, false}, {poller.DefaultWorkers, false}, {1, true}, {poller.DefaultWorkers, true}} {
		n := c.n
		name := fmt.Sprintf("channels=%d", n)
		if c.props {
			name += "/poller-properties"
		}
		b.Run(name, func(b *testing.B) {
			e := setup(b, checkpoint.Delete)
			conn, err := amqp.Dial(e.broker.URL)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			ctx := testenv.WorkContext(b)
			total, elapsed := 0, time.Duration(0)
			for range b.N {
				b.StopTimer()
				purge(b, e.broker.URL, e.broker.Queue)
				b.StartTimer()
				start := time.Now()
				err := bench.PublishBare(ctx, conn, e.broker.Exchange, "bench", n, benchRows, publish.DefaultConfirmWindow,
					func(j int) amqp.Publishing {
						m := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body}
						if c.props {
							// What publish.FromRecord sets for a row.
							m.MessageId = "01a204e0-be49-731f-ac20-d4df6e306f60"
							m.Type, m.ContentType, m.Timestamp = "", "application/json", time.Now()
							m.Headers = amqp.Table{"x-outbox-id": int64(j), "x-partition-key": fmt.Sprintf("p%d", j%benchPartitions),
								"x-relay-epoch": int64(7)}
						}
						return m
					})
				if err != nil {
					b.Fatal(err)
				}
				elapsed += time.Since(start)
				total += benchRows
			}
			b.ReportMetric(float64(total)/elapsed.Seconds(), "msgs/s")
		})
	}
}

func purge(b *testing.B, url, queue string) {
	b.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := ch.QueuePurge(queue, false); err != nil {
		b.Fatal(err)
	}
}
