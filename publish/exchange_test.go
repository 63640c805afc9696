package publish_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Bad input costs its neighbours nothing: in a stream over many keys where
// every 50th message names an exchange that does not exist, each of those
// is Returned with 404, and every other message arrives exactly once, first
// deliveries in publish order per key.
func TestMissingExchangeCostsNeighboursNothing(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	cons := consume(t, b.URL, b.Queue)
	p := newPublisher(t, b.URL, nil)
	missing := "no-such-exchange." + b.Exchange

	const lanes, keys, total = 2, 30, 3000
	chans := make([]*publish.Channel, lanes)
	res := make([]*results, lanes)
	msgs := make([][]publish.Message, lanes)
	for lane := range lanes {
		chans[lane], res[lane] = newChannel(t, p)
	}
	bad := map[any]bool{}
	for i := range total {
		id, key := uint64(i+1), i%keys
		ex := b.Exchange
		if id%50 == 0 {
			ex = missing
			bad[id] = true
		}
		msgs[key%lanes] = append(msgs[key%lanes], message(t, record(id, key, ex, "k")))
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
		checkResults(t, res[lane].all(), msgs[lane], func(tag any) publish.Outcome {
			if bad[tag] {
				return publish.Returned
			}
			return publish.Confirmed
		})
		for _, r := range res[lane].all() {
			if r.Outcome == publish.Returned && (r.Code != 404 || !strings.HasPrefix(r.Reason, "exchange not found: 404 NOT_FOUND")) {
				t.Errorf("returned %v: code %d reason %q, want 404 exchange not found", r.Tag, r.Code, r.Reason)
			}
		}
	}
	ds := barrier(t, cons, b.Exchange, "k", chans...)
	if n, want := distinctIDs(ds), total-len(bad); n != want {
		t.Errorf("consumer got %d distinct messages, want %d", n, want)
	}
	if dups := checkFirstDeliveryOrder(t, ds); dups != 0 {
		t.Errorf("%d duplicates of good messages", dups)
	}
}
