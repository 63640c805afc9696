package publish_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// publishAll publishes msgs in order on c and waits for their Results.
//
// It fails when no Result has come for progress.Patience, not after a
// fixed time: a busy machine's broker (a nack storm at load 25 took more
// than a minute) is slow, not stuck.
func publishAll(t *testing.T, c *publish.Channel, msgs []publish.Message) {
	t.Helper()
	ctx, cancel := context.WithCancel(testenv.WorkContext(t))
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, m := range msgs {
			if err := c.Publish(ctx, m); err != nil {
				t.Errorf("Publish %v: %v", m.Tag, err)
				return
			}
		}
		if err := c.Flush(ctx); err != nil {
			t.Errorf("Flush: %v", err)
		}
	}()
	measure := func() int64 { return 0 }
	if r, ok := resultsOf.Load(c); ok {
		measure = func() int64 { return int64(r.(*results).len()) }
	}
	finished := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	if err := progress.Wait(ctx, "publish and flush", measure, finished); err != nil {
		cancel()
		<-done
		t.Errorf("publish %d messages: %v", len(msgs), err)
	}
}

// checkResults checks that results are one per message, in publish order
// per key (Message.Key; messages without a key in any order), with the
// outcome want gives for each tag.
func checkResults(t *testing.T, got []publish.Result, msgs []publish.Message, want func(tag any) publish.Outcome) {
	t.Helper()
	if len(got) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(got), len(msgs))
	}
	index := make(map[any]int, len(msgs))
	for i, m := range msgs {
		index[m.Tag] = i
	}
	last := map[string]int{} // per key, the index of the message of the last Result
	seen := make([]bool, len(msgs))
	for n, r := range got {
		i, ok := index[r.Tag]
		if !ok || seen[i] {
			t.Fatalf("result %d has tag %v: not a message's, or its second Result", n, r.Tag)
		}
		seen[i] = true
		if key := msgs[i].Key; key != "" {
			if prev, ok := last[key]; ok && prev > i {
				t.Fatalf("result %d has tag %v after the Result of %v, published later with the same key %q (publish order per key)",
					n, r.Tag, msgs[prev].Tag, key)
			}
			last[key] = i
		}
		if w := want(r.Tag); r.Outcome != w {
			t.Errorf("message %v: outcome %v (%d %q), want %v", r.Tag, r.Outcome, r.Code, r.Reason, w)
		}
	}
}

func allConfirmed(any) publish.Outcome { return publish.Confirmed }

// checkFirstDeliveryOrder checks that, per lane, the first delivery of each
// message comes in id order, and returns the number of duplicates.
func checkFirstDeliveryOrder(t *testing.T, ds []amqp.Delivery) (dups int) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, d := range ds {
		if seen[d.MessageId] {
			dups++
			continue
		}
		seen[d.MessageId] = true
		lane := d.Headers["x-partition-key"].(string)
		id := d.Headers["x-outbox-id"].(int64)
		if id <= last[lane] {
			t.Errorf("lane %s: first delivery of id %d after id %d", lane, id, last[lane])
		}
		last[lane] = id
	}
	return dups
}

func TestConfirmsOrderAndWireFormat(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	p := newPublisher(t, b.URL, nil)
	cons := consume(t, b.URL, b.Queue)

	const lanes, perLane = 4, 2500
	sent := map[string]publish.Message{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	res := make([]*results, lanes)
	msgs := make([][]publish.Message, lanes)
	chans := make([]*publish.Channel, lanes)
	for lane := range lanes {
		var c *publish.Channel
		c, res[lane] = newChannel(t, p)
		chans[lane] = c
		for i := range perLane {
			id := uint64(lane*perLane + i + 1)
			m := message(t, record(id, lane, b.Exchange, fmt.Sprintf("lane.%d", lane)))
			msgs[lane] = append(msgs[lane], m)
			sent[m.Publishing.MessageId] = m
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			publishAll(t, c, msgs[lane])
		}()
	}
	wg.Wait()
	for lane := range lanes {
		checkResults(t, res[lane].all(), msgs[lane], allConfirmed)
	}

	ds := barrier(t, cons, b.Exchange, "barrier", chans...)
	if len(ds) != lanes*perLane || distinctIDs(ds) != lanes*perLane {
		t.Fatalf("consumer got %d deliveries of %d messages, want %d once each", len(ds), distinctIDs(ds), lanes*perLane)
	}
	if dups := checkFirstDeliveryOrder(t, ds); dups != 0 {
		t.Errorf("%d duplicates without a fault", dups)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, d := range ds {
		m := sent[d.MessageId]
		want := m.Publishing
		if d.Exchange != m.Exchange || d.RoutingKey != m.RoutingKey ||
			d.ContentType != want.ContentType || d.DeliveryMode != amqp.Persistent ||
			d.Type != want.Type || string(d.Body) != string(want.Body) ||
			!d.Timestamp.Equal(want.Timestamp.Truncate(time.Second)) ||
			!reflect.DeepEqual(d.Headers, want.Headers) {
			t.Fatalf("delivery differs from the message FromRecord built:\ngot  %s %s %+v\nwant %s %s %+v",
				d.Exchange, d.RoutingKey, deliveryProps(d), m.Exchange, m.RoutingKey, want)
		}
	}
}

func deliveryProps(d amqp.Delivery) amqp.Publishing {
	return amqp.Publishing{Headers: d.Headers, ContentType: d.ContentType, DeliveryMode: d.DeliveryMode,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type}
}

func TestUnroutableIsReturned(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	p := newPublisher(t, b.URL, nil)
	cons := consume(t, b.URL, b.Queue)
	c, res := newChannel(t, p)

	// The default exchange routes by queue name: "no-such-queue..." has none.
	unroutable := map[any]bool{uint64(5): true, uint64(6): true, uint64(20): true}
	var msgs []publish.Message
	for id := uint64(1); id <= 40; id++ {
		key := b.Queue
		if unroutable[id] {
			key = "no-such-queue." + b.Queue
		}
		msgs = append(msgs, message(t, record(id, 0, "", key)))
	}
	publishAll(t, c, msgs)
	checkResults(t, res.all(), msgs, func(tag any) publish.Outcome {
		if unroutable[tag] {
			return publish.Returned
		}
		return publish.Confirmed
	})
	for _, r := range res.all() {
		if r.Outcome == publish.Returned && (r.Code != 312 || !strings.Contains(r.Reason, "NO_ROUTE")) {
			t.Errorf("returned %v: code %d reason %q, want 312 NO_ROUTE", r.Tag, r.Code, r.Reason)
		}
	}
	ds := cons.waitFor(t, 10*time.Second, func(ds []amqp.Delivery) bool { return len(ds) >= 37 })
	if dups := checkFirstDeliveryOrder(t, ds); dups != 0 || len(ds) != 37 {
		t.Errorf("consumer got %d deliveries (%d duplicates), want the 37 routable ones", len(ds), dups)
	}
}

// An exchange deleted after the Publisher found it exists: the broker
// closes the channel over the publish. 10 and 30 are pipelined with messages
// of other keys (probe mode finds them, unless 30 comes after the first
// close and its exchange is checked again); 61 is published alone (the one
// unconfirmed message is the culprit). Each is Returned with 404; everything
// else is Confirmed, Results in publish order per key, first deliveries in
// order per key.
func TestExchangeDeletedAfterCheck(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	p := newPublisher(t, b.URL, nil)
	cons := consume(t, b.URL, b.Queue)
	c, res := newChannel(t, p)

	// Nothing is bound to gone1 and gone2: the first message to each is
	// returned unroutable, and the Publisher knows they exist.
	gone1, gone2 := b.Exchange+".gone1", b.Exchange+".gone2"
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range []string{gone1, gone2} {
		if err := ch.ExchangeDeclare(ex, amqp.ExchangeTopic, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	warm := []publish.Message{message(t, record(1, 1, gone1, "k")), message(t, record(2, 2, gone2, "k"))}
	publishAll(t, c, warm)
	for _, ex := range []string{gone1, gone2} {
		if err := ch.ExchangeDelete(ex, false, false); err != nil {
			t.Fatal(err)
		}
	}

	missing := map[any]bool{uint64(10): true, uint64(30): true, uint64(61): true}
	msgs := warm
	for id := uint64(3); id <= 80; id++ {
		ex := b.Exchange
		switch id {
		case 10, 30:
			ex = gone1
		case 61:
			ex = gone2
		}
		msgs = append(msgs, message(t, record(id, int(id%8), ex, "k")))
	}
	publishAll(t, c, msgs[2:60])
	publishAll(t, c, msgs[60:61])
	publishAll(t, c, msgs[61:])
	checkResults(t, res.all(), msgs, func(tag any) publish.Outcome {
		if missing[tag] || tag == uint64(1) || tag == uint64(2) {
			return publish.Returned
		}
		return publish.Confirmed
	})
	for _, r := range res.all() {
		if missing[r.Tag] && (r.Code != 404 || !strings.HasPrefix(r.Reason, "exchange not found")) {
			t.Errorf("returned %v: code %d reason %q, want 404 exchange not found", r.Tag, r.Code, r.Reason)
		}
	}
	ds := cons.waitFor(t, 10*time.Second, func(ds []amqp.Delivery) bool { return distinctIDs(ds) >= 75 })
	dups := checkFirstDeliveryOrder(t, ds)
	t.Logf("%d deliveries, %d duplicates from republishing after the channel closes", len(ds), dups)
}

func TestReconnectAfterCut(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	proxy := newFaultProxy(t, amqpHostPort(t, b.URL))
	var reconnects atomic.Int32
	p := newPublisher(t, viaProxy(t, b.URL, proxy.Addr()), func(c *publish.Config) {
		c.ReconnectMin = 20 * time.Millisecond
		c.ReconnectMax = 200 * time.Millisecond
		c.OnReconnect = func(string) { reconnects.Add(1) }
	})
	cons := consume(t, b.URL, b.Queue)

	const lanes, perLane = 2, 1000
	res, msgs, wg := publishLanes(t, p, b.Exchange, lanes, perLane)
	// Cut twice mid-stream, once while refusing new connections for a while.
	total := func() int { return res[0].len() + res[1].len() }
	waitUntil(t, 30*time.Second, "400 results", func() bool { return total() >= 400 })
	proxy.Cut()
	waitUntil(t, 30*time.Second, "1200 results", func() bool { return total() >= 1200 })
	proxy.Disable()
	proxy.Cut()
	refused := proxy.Refused()
	waitUntil(t, 30*time.Second, "two dials refused", func() bool { return proxy.Refused() >= refused+2 })
	proxy.Enable()
	wg.Wait()

	for lane := range lanes {
		checkResults(t, res[lane].all(), msgs[lane], allConfirmed)
	}
	ds := cons.waitFor(t, 30*time.Second, func(ds []amqp.Delivery) bool { return distinctIDs(ds) >= lanes*perLane })
	dups := checkFirstDeliveryOrder(t, ds)
	t.Logf("%d messages, %d deliveries, %d duplicates, %d reconnects", lanes*perLane, len(ds), dups, reconnects.Load())
	if reconnects.Load() < 2 {
		t.Errorf("OnReconnect called %d times, want at least 2", reconnects.Load())
	}
}

func TestBrokerDownAtStart(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	proxy := newFaultProxy(t, amqpHostPort(t, b.URL))
	proxy.Disable()
	p := newPublisher(t, viaProxy(t, b.URL, proxy.Addr()), func(c *publish.Config) {
		c.ReconnectMin = 20 * time.Millisecond
		c.ReconnectMax = 100 * time.Millisecond
	})
	c, res := newChannel(t, p)
	m := message(t, record(1, 0, b.Exchange, "k"))

	// The deadline is the assertion: Publish must wait for the broker
	// rather than fail or accept the message without a channel.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := c.Publish(ctx, m); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish with the broker down: %v, want context.DeadlineExceeded", err)
	}
	proxy.Enable()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Publish(ctx, m); err != nil {
		t.Fatalf("Publish after the broker came up: %v", err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if got := res.all(); len(got) != 1 || got[0].Outcome != publish.Confirmed {
		t.Fatalf("results %+v, want one Confirmed", got)
	}
}

func TestNewRejectsBadCredentials(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	u, err := amqp.ParseURI(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Password = "s3cret-wrong"
	start := time.Now()
	p, err := publish.New(context.Background(), publish.Config{URL: u.String()})
	if err == nil {
		p.Close()
		t.Fatal("New with a wrong password succeeded")
	}
	t.Logf("error after %v: %v", time.Since(start), err)
	if strings.Contains(err.Error(), "s3cret-wrong") {
		t.Errorf("error shows the password: %v", err)
	}
	if !strings.Contains(err.Error(), "ACCESS_REFUSED") {
		t.Errorf("error %q does not say ACCESS_REFUSED", err)
	}
}

func TestCloseUnblocksPublish(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	// One message held at a time: the callback holds the first Result,
	// so the second message waits for MaxHeldBytes room.
	p := newPublisher(t, b.URL, func(c *publish.Config) { c.MaxHeldBytes = 1 })
	block := make(chan struct{})
	c, err := p.NewChannel(func(publish.Result) { <-block })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Publish(ctx, message(t, record(1, 0, b.Exchange, "k"))); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Publish(ctx, message(t, record(2, 0, b.Exchange, "k"))) }()
	// Nothing marks "still waiting": the bounded wait is the assertion. A
	// Publish that does not wait returns at once and fails here; a slow
	// machine only makes the check weaker, never wrong.
	select {
	case err := <-errc:
		t.Fatalf("Publish with MaxHeldBytes spent returned %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(block)
	if err := <-errc; err != nil {
		t.Fatalf("Publish after the first Result: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, message(t, record(3, 0, b.Exchange, "k"))); !errors.Is(err, publish.ErrClosed) {
		t.Fatalf("Publish after Close: %v, want ErrClosed", err)
	}
}

func TestNackedIsRejectedAfterMaxAttempts(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	// A queue full with one message that rejects what does not fit: the
	// broker nacks every publish routed only to it.
	full := "full." + b.Queue
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(full, false, true, false, false,
		amqp.Table{"x-max-length": int64(1), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := ch.QueueDelete(full, false, false, false); err != nil {
			t.Errorf("delete queue %s: %v", full, err)
		}
	}()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", full, false, false, amqp.Publishing{Body: []byte("filler")})
	if err != nil || !dc.Wait() {
		t.Fatalf("publish filler: %v", err)
	}

	const giveUp = 1500 * time.Millisecond
	p := newPublisher(t, b.URL, func(c *publish.Config) {
		c.MaxAttempts, c.NackGiveUp = 3, giveUp
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 200*time.Millisecond
	})
	c, res := newChannel(t, p)
	nacked := map[any]bool{uint64(3): true, uint64(7): true}
	var msgs []publish.Message
	for id := uint64(1); id <= 20; id++ {
		key := b.Queue
		if nacked[id] {
			key = full
		}
		msgs = append(msgs, message(t, record(id, 0, "", key)))
	}
	began := time.Now()
	publishAll(t, c, msgs)
	// A broker that nacks for a while (a quorum queue electing a leader)
	// must not cost the message: it is given up only after NackGiveUp.
	if took := time.Since(began); took < giveUp {
		t.Errorf("the nacked messages were given up %v after their publish, before NackGiveUp %v", took, giveUp)
	}
	checkResults(t, res.all(), msgs, func(tag any) publish.Outcome {
		if nacked[tag] {
			return publish.Rejected
		}
		return publish.Confirmed
	})
	for _, r := range res.all() {
		if r.Outcome == publish.Rejected && !strings.HasPrefix(r.Reason, "nacked ") {
			t.Errorf("rejected %v: reason %q, want \"nacked N times over D\"", r.Tag, r.Reason)
		}
	}
}

// Config.URL lists two nodes (two proxies in front of one broker here): the
// Publisher connects to the first that answers, names it in Node and in
// OnReconnect, and when that connection is lost and its node refuses, moves
// to the other node of the list; every message is confirmed and arrives.
func TestSeveralURLsTriedInTurn(t *testing.T) {
	checkGoroutines(t)
	b := testenv.RabbitMQ(t)
	one := newFaultProxy(t, amqpHostPort(t, b.URL))
	two := newFaultProxy(t, amqpHostPort(t, b.URL))
	one.Disable() // the first node does not answer at the start
	var reconnectedTo atomic.Value
	p := newPublisher(t, viaProxy(t, b.URL, one.Addr())+", "+viaProxy(t, b.URL, two.Addr()), func(c *publish.Config) {
		c.ReconnectMin = 20 * time.Millisecond
		c.ReconnectMax = 200 * time.Millisecond
		c.OnReconnect = func(node string) { reconnectedTo.Store(node) }
	})
	if got := p.Node(); got != two.Addr() {
		t.Fatalf("connected to %q, want the second node %s (the first refuses)", got, two.Addr())
	}
	cons := consume(t, b.URL, b.Queue)
	c, res := newChannel(t, p)
	var msgs []publish.Message
	for i := range 400 {
		msgs = append(msgs, message(t, record(uint64(i+1), i%10, b.Exchange, "k")))
	}
	publishAll(t, c, msgs[:200])

	one.Enable()
	two.Disable()
	two.Cut()
	waitUntil(t, 30*time.Second, "a reconnect to the first node", func() bool { return p.Node() == one.Addr() })
	if got, _ := reconnectedTo.Load().(string); got != one.Addr() {
		t.Errorf("OnReconnect named %q, want %s", got, one.Addr())
	}
	publishAll(t, c, msgs[200:])
	checkResults(t, res.all(), msgs, allConfirmed)
	ds := cons.waitFor(t, 30*time.Second, func(ds []amqp.Delivery) bool { return distinctIDs(ds) >= len(msgs) })
	checkFirstDeliveryOrder(t, ds)
}
