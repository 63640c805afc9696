package publish_test

import (
	"math"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// A length-limited queue that refuses what does not fit (reject-publish),
// drained by a slow consumer: the broker nacks publishes all the time, and
// a consumer ack frees room between a nack and the next publish. Every
// message still arrives once, the first deliveries of each key come in
// publish order, and every Result is Confirmed, in publish order per key.
func TestNackedKeepsOrderPerKey(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	queue := b.DeclareQueueArgs(t, "limited.#", amqp.Table{"x-max-length": int64(20), "x-overflow": "reject-publish"})
	cons := consumeSlowly(t, b.URL, queue, time.Millisecond)
	p := newPublisher(t, b.URL, func(c *publish.Config) { c.MaxAttempts = math.MaxInt32 })

	// 3,000 messages over 30 keys, round robin, keys split over 2 Channels.
	const lanes, keys, total = 2, 30, 3000
	chans := make([]*publish.Channel, lanes)
	res := make([]*results, lanes)
	msgs := make([][]publish.Message, lanes)
	for lane := range lanes {
		chans[lane], res[lane] = newChannel(t, p)
	}
	for i := range total {
		key := i % keys
		msgs[key%lanes] = append(msgs[key%lanes], message(t, record(uint64(i+1), key, "", queue)))
	}
	var wg sync.WaitGroup
	for lane := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			publishAll(t, chans[lane], msgs[lane])
		}()
	}
	wg.Wait()
	for lane := range lanes {
		checkResults(t, res[lane].all(), msgs[lane], allConfirmed)
	}
	ds := barrier(t, cons, "", queue, chans...)
	if n := distinctIDs(ds); n != total {
		t.Errorf("consumer got %d of %d messages", n, total)
	}
	// A nacked publish is not enqueued: nothing may arrive twice.
	if dups := checkFirstDeliveryOrder(t, ds); dups != 0 {
		t.Errorf("%d duplicates without a connection loss", dups)
	}
}
