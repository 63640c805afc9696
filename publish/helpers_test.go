package publish_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// checkGoroutines fails the test when goroutines started during it are still
// running a few seconds after every cleanup registered later has run (t.Cleanup
// is LIFO: call this first). amqp091 stops its reader and heartbeater
// goroutines shortly after a connection closes, hence the wait.
func checkGoroutines(t testing.TB) {
	base := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Errorf("goroutine leak: %d running, %d before the test\n%s", runtime.NumGoroutine(), base, buf[:n])
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

func newPublisher(t testing.TB, url string, mod func(*publish.Config)) *publish.Publisher {
	t.Helper()
	cfg := publish.Config{URL: url, Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p, err := publish.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("publish.New: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close publisher: %v", err)
		}
		cancel()
	})
	return p
}

// results collects one Channel's Results.
type results struct {
	mu   sync.Mutex
	list []publish.Result
}

func (r *results) add(res publish.Result) {
	r.mu.Lock()
	r.list = append(r.list, res)
	r.mu.Unlock()
}

func (r *results) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.list)
}

func (r *results) all() []publish.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]publish.Result(nil), r.list...)
}

func newChannel(t testing.TB, p *publish.Publisher) (*publish.Channel, *results) {
	t.Helper()
	r := &results{}
	c, err := p.NewChannel(r.add)
	if err != nil {
		t.Fatalf("NewChannel: %v", err)
	}
	resultsOf.Store(c, r)
	t.Cleanup(func() { c.Close(); resultsOf.Delete(c) })
	return c, r
}

// resultsOf maps a Channel of newChannel to its results: what publishAll
// watches for progress.
var resultsOf sync.Map

// record is outbox row id of lane, with a 256-byte payload and headers of
// every supported type.
func record(id uint64, lane int, exchange, routingKey string) *outbox.Record {
	var mid outbox.MessageID
	binary.BigEndian.PutUint64(mid[0:8], uint64(time.Now().UnixNano()))
	binary.BigEndian.PutUint64(mid[8:16], id)
	payload := []byte(fmt.Sprintf(`{"lane":%d,"id":%d,"pad":"`, lane, id))
	payload = append(payload, strings.Repeat("x", 256-len(payload)-2)...)
	payload = append(payload, `"}`...)
	return &outbox.Record{
		ID:           id,
		MessageID:    mid,
		PartitionKey: fmt.Sprintf("lane-%d", lane),
		Exchange:     exchange,
		RoutingKey:   routingKey,
		MessageType:  "test.event",
		Headers:      []byte(fmt.Sprintf(`{"tenant":"acme","lane":%d,"ratio":0.5,"flag":true}`, lane)),
		Payload:      payload,
		ContentType:  "application/json",
		CreatedAt:    time.Now().UTC(),
	}
}

func message(t testing.TB, rec *outbox.Record) publish.Message {
	t.Helper()
	m, err := publish.FromRecord(rec, "", 7, false)
	if err != nil {
		t.Fatalf("FromRecord: %v", err)
	}
	m.Tag = rec.ID
	return m
}

// consumer reads a queue on a connection of its own, straight to the broker.
type consumer struct {
	mu   sync.Mutex
	got  []amqp.Delivery
	cond chan struct{} // closed and replaced on every delivery
}

func consume(t testing.TB, url, queue string) *consumer {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("consumer dial: %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("consumer channel: %v", err)
	}
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume %s: %v", queue, err)
	}
	c := &consumer{cond: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			c.mu.Lock()
			c.got = append(c.got, d)
			close(c.cond)
			c.cond = make(chan struct{})
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return c
}

// consumeSlowly is consume with manual acks, one message at a time, each
// acknowledged delay after it arrived: a consumer slower than the publisher,
// so that a length-limited queue stays full. The sleep is the consumer's
// work, not a wait for a condition.
func consumeSlowly(t testing.TB, url, queue string, delay time.Duration) *consumer {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("consumer dial: %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("consumer channel: %v", err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatalf("consumer prefetch: %v", err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume %s: %v", queue, err)
	}
	c := &consumer{cond: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			c.mu.Lock()
			c.got = append(c.got, d)
			close(c.cond)
			c.cond = make(chan struct{})
			c.mu.Unlock()
			time.Sleep(delay)
			_ = d.Ack(false)
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return c
}

// barrierPrefix marks the MessageId of the messages barrier publishes.
const barrierPrefix = "barrier-"

// barrier publishes a marker on each Channel once everything published on
// it before has its Result, and waits until cons has received every marker.
// A message reaches the queue before its Result (each copy of it, when it
// was republished without a connection loss), so the markers are behind all
// of them: once they have arrived, every delivery and duplicate that was
// going to arrive has. Deliveries of markers are left out of the returned
// deliveries.
func barrier(t *testing.T, cons *consumer, exchange, routingKey string, chans ...*publish.Channel) []amqp.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	want := map[string]bool{}
	for i, c := range chans {
		if err := c.Flush(ctx); err != nil {
			t.Fatalf("flush before the barrier: %v", err)
		}
		id := fmt.Sprintf("%s%d-%d", barrierPrefix, time.Now().UnixNano(), i)
		want[id] = true
		m := publish.Message{Exchange: exchange, RoutingKey: routingKey, Publishing: amqp.Publishing{MessageId: id}}
		if err := c.Publish(ctx, m); err != nil {
			t.Fatalf("publish the barrier: %v", err)
		}
	}
	ds := cons.waitFor(t, 60*time.Second, func(ds []amqp.Delivery) bool {
		n := 0
		for _, d := range ds {
			if want[d.MessageId] {
				n++
			}
		}
		return n == len(want)
	})
	var out []amqp.Delivery
	for _, d := range ds {
		if !strings.HasPrefix(d.MessageId, barrierPrefix) {
			out = append(out, d)
		}
	}
	return out
}

// waitUntil polls cond until it holds, failing the test after timeout.
func waitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitFor waits until pred holds over the deliveries so far.
func (c *consumer) waitFor(t testing.TB, timeout time.Duration, pred func([]amqp.Delivery) bool) []amqp.Delivery {
	t.Helper()
	deadline := time.After(timeout)
	for {
		c.mu.Lock()
		got, cond := c.got, c.cond
		c.mu.Unlock()
		if pred(got) {
			return got
		}
		select {
		case <-cond:
		case <-deadline:
			t.Fatalf("consumer: condition not met after %v with %d deliveries", timeout, len(got))
		}
	}
}

func distinctIDs(ds []amqp.Delivery) int {
	seen := map[string]bool{}
	for _, d := range ds {
		seen[d.MessageId] = true
	}
	return len(seen)
}

// faultProxy is a TCP proxy that can cut its connections and refuse new
// ones. TODO: use testenv.Proxy once the harness has it.
type faultProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	disabled bool
	refused  int // connections refused while disabled
}

func newFaultProxy(t testing.TB, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &faultProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

func (p *faultProxy) Addr() string { return p.ln.Addr().String() }

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		disabled := p.disabled
		p.mu.Unlock()
		if disabled {
			p.mu.Lock()
			p.refused++
			p.mu.Unlock()
			down.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		p.conns[down] = struct{}{}
		p.conns[up] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(down, up)
		go p.pipe(up, down)
	}
}

func (p *faultProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Cut closes every open connection; new ones are still accepted.
func (p *faultProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

func (p *faultProxy) Disable() { p.mu.Lock(); p.disabled = true; p.mu.Unlock() }
func (p *faultProxy) Enable()  { p.mu.Lock(); p.disabled = false; p.mu.Unlock() }

// Refused is how many connections were refused while disabled.
func (p *faultProxy) Refused() int { p.mu.Lock(); defer p.mu.Unlock(); return p.refused }

func amqpHostPort(t testing.TB, url string) string {
	t.Helper()
	u, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return net.JoinHostPort(u.Host, fmt.Sprint(u.Port))
}

func viaProxy(t testing.TB, url, addr string) string {
	t.Helper()
	u, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatalf("parse url: %v", err)
	}
	host, port, _ := net.SplitHostPort(addr)
	u.Host = host
	fmt.Sscan(port, &u.Port)
	return u.String()
}

// publishLanes publishes perLane messages on each of lanes Channels of p, in
// the background, 10 keys per Channel (some messages on the wire, some
// parked behind their key's at a fault); wg.Wait returns when each was
// accepted. It returns each Channel's results and messages.
func publishLanes(t *testing.T, p *publish.Publisher, exchange string, lanes, perLane int) ([]*results, [][]publish.Message, *sync.WaitGroup) {
	t.Helper()
	wg := &sync.WaitGroup{}
	res := make([]*results, lanes)
	msgs := make([][]publish.Message, lanes)
	for lane := range lanes {
		var c *publish.Channel
		c, res[lane] = newChannel(t, p)
		for i := range perLane {
			id := uint64(lane*perLane + i + 1)
			msgs[lane] = append(msgs[lane], message(t, record(id, lane*10+i%10, exchange, "k")))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			publishAll(t, c, msgs[lane])
		}()
	}
	return res, msgs, wg
}
