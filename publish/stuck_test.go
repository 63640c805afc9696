package publish_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// A connection that stays up while no confirmation comes back (here a
// network that silently drops everything, before the client's heartbeat
// gives up on it; on a real cluster, RabbitMQ before 4.2 can leave a
// channel's quorum-queue publishes unconfirmed for good after a node
// outage) is closed after ConfirmStuckAfter and dialled again: every
// message is confirmed and delivered, first deliveries in order per key.
func TestStuckConfirmsReconnect(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	proxy := testenv.Proxy(t, amqpHostPort(t, b.URL))
	core, logs := observer.New(zap.WarnLevel)
	p := newPublisher(t, viaProxy(t, b.URL, proxy.Addr()), func(c *publish.Config) {
		c.ConfirmStuckAfter = time.Second
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 200*time.Millisecond
		c.Logger = zap.New(core)
	})
	cons := consume(t, b.URL, b.Queue)

	const lanes, perLane = 2, 1000
	res, msgs, wg := publishLanes(t, p, b.Exchange, lanes, perLane)
	total := func() int { return res[0].len() + res[1].len() }
	waitUntil(t, progress.Patience, "400 results", func() bool { return total() >= 400 })
	proxy.Stall()
	stuck := func() int { return logs.FilterMessageSnippet("no publisher confirms for a while").Len() }
	waitUntil(t, progress.Patience, "the stuck connection closed", func() bool { return stuck() > 0 })
	// Closed, not only logged: no connection while the network still drops
	// everything (the redial reaches no broker), long before the client's
	// own heartbeat would give up.
	if up, _ := p.Connected(); up {
		t.Fatal("still connected after the stuck connection was reported closed")
	}
	proxy.Unstall()
	wg.Wait()

	for lane := range lanes {
		checkResults(t, res[lane].all(), msgs[lane], allConfirmed)
	}
	ds := cons.waitFor(t, progress.Patience, func(ds []amqp.Delivery) bool { return distinctIDs(ds) >= lanes*perLane })
	dups := checkFirstDeliveryOrder(t, ds)
	t.Logf("%d messages, %d deliveries, %d duplicates, %d stuck connections closed", lanes*perLane, len(ds), dups, stuck())
}
