package streams

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/publish"
)

// Lane is one partition's producer as a relay lane uses it: Publish(ctx,
// m) with the lane's callback (a publish.Channel's shape).
type Lane struct {
	*Producer
	onResult func(publish.Result)
}

// NewLane is pr publishing with onResult.
func NewLane(pr *Producer, onResult func(publish.Result)) *Lane {
	return &Lane{Producer: pr, onResult: onResult}
}

// Publish sends m with its publishing id m.Seq.
func (l *Lane) Publish(ctx context.Context, m publish.Message) error {
	return l.Producer.Publish(ctx, m, l.onResult)
}

// Router publishes messages of any partition, as a poller's worker does:
// each to its partition (Partition of its key, or of its message id for
// the key ”), through the Publisher's producers "<prefix>-<i>", numbered
// by them above the broker's last ids (at least once), each producer
// asking the broker once, on first use. Its
// methods have a publish.Channel's contract: Publish, Flush, Close. A
// Router is used by one goroutine; several Routers may share producers.
type Router struct {
	pub      *Publisher
	prefix   string
	suffix   string
	onResult func(publish.Result)

	mu      sync.Mutex
	pending int
	idle    chan struct{} // closed and replaced when pending drops to 0
	used    map[*Producer]bool
}

// NewRouter returns a router over pub's producers "<prefix>-<i><suffix>";
// every result goes to onResult.
func (p *Publisher) NewRouter(prefix, suffix string, onResult func(publish.Result)) *Router {
	return &Router{pub: p, prefix: prefix, suffix: suffix, onResult: onResult, idle: make(chan struct{}), used: map[*Producer]bool{}}
}

// Publish sends m to its partition with the next id of that partition's
// producer.
func (r *Router) Publish(ctx context.Context, m publish.Message) error {
	i := Partition(m.Key, m.Publishing.MessageId, r.pub.cfg.Partitions)
	pr, err := r.pub.StartFresh(ctx, r.prefix+"-"+strconv.Itoa(i)+r.suffix, i)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.pending++
	r.used[pr] = true
	r.mu.Unlock()
	m.Seq = 0
	if err := pr.Publish(ctx, m, r.resolved); err != nil {
		r.done()
		return fmt.Errorf("publish to stream %s: %w", pr.stream, err)
	}
	return nil
}

func (r *Router) resolved(res publish.Result) {
	r.onResult(res)
	r.done()
}

func (r *Router) done() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending--
	if r.pending == 0 {
		close(r.idle)
		r.idle = make(chan struct{})
	}
}

// flushCheck is how often Flush looks for a failed producer.
const flushCheck = 100 * time.Millisecond

// Flush waits until every message published through r has its result; it
// returns a producer's failure, or ctx's error.
func (r *Router) Flush(ctx context.Context) error {
	for {
		r.mu.Lock()
		n, idle := r.pending, r.idle
		var failed []*Producer
		for pr := range r.used {
			failed = append(failed, pr)
		}
		r.mu.Unlock()
		for _, pr := range failed {
			if err := pr.Err(); err != nil {
				return err
			}
		}
		if n == 0 {
			return nil
		}
		// A failed producer gives no more results: look again now and
		// then rather than wait on each producer's Failed.
		t := time.NewTimer(flushCheck)
		select {
		case <-idle:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		t.Stop()
	}
}

// Close does nothing: the producers belong to the Publisher.
func (r *Router) Close() error { return nil }
