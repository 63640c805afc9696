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
// the key ”), through the Publisher's producers "<prefix>-<i><suffix>",
// numbered by them freshly (StartFresh: at least once), each producer
// asking the broker once, on first use. A producer that failed is replaced
// (Publisher.StartFresh), so a Router that outlives a failed round (the
// due-time sweep's) delivers again, but never within a round: while a
// message this Router sent through a failed producer has no result,
// Publish returns the failure (and forgets the producer's messages, as
// Flush does), so the round ends and is published again whole. Replacing
// it there would store the round's later messages of a key before the
// failed producer's earlier ones are published again: the stream would
// read m2 m3 m1 m2 m3. Its methods have a
// publish.Channel's contract: Publish, Flush, Close. A Router is used by
// one goroutine; several Routers may share producers.
type Router struct {
	pub      *Publisher
	prefix   string
	suffix   string
	onResult func(publish.Result)

	mu      sync.Mutex
	pending map[*Producer]int // messages without a result, per producer
	idle    chan struct{}     // closed and replaced when no message is pending
}

// NewRouter returns a router over pub's producers "<prefix>-<i><suffix>";
// every result goes to onResult.
func (p *Publisher) NewRouter(prefix, suffix string, onResult func(publish.Result)) *Router {
	return &Router{pub: p, prefix: prefix, suffix: suffix, onResult: onResult, idle: make(chan struct{}),
		pending: map[*Producer]int{}}
}

// Publish sends m to its partition with the next id of that partition's
// producer.
func (r *Router) Publish(ctx context.Context, m publish.Message) error {
	i := Partition(m.Key, m.Publishing.MessageId, r.pub.cfg.Partitions)
	if err := r.failedInRound(); err != nil {
		return fmt.Errorf("publish to stream %s: an earlier message of the round has no result: %w", r.pub.cfg.PartitionName(i), err)
	}
	pr, err := r.pub.StartFresh(ctx, r.prefix+"-"+strconv.Itoa(i)+r.suffix, i)
	if err != nil {
		return err
	}
	// Once more: a producer of the round may have failed while StartFresh
	// waited (for the opening slot, the broker), and StartFresh replaced
	// it; m would go to the replacement and be stored while an earlier
	// message of its key, on the failed one, was not. A replaced
	// producer's failure never clears, so this check cannot miss it.
	if err := r.failedInRound(); err != nil {
		return fmt.Errorf("publish to stream %s: an earlier message of the round has no result: %w", r.pub.cfg.PartitionName(i), err)
	}
	r.mu.Lock()
	r.pending[pr]++
	r.mu.Unlock()
	m.Seq = 0
	if err := pr.Publish(ctx, m, func(res publish.Result) {
		r.onResult(res)
		r.done(pr)
	}); err != nil {
		r.done(pr)
		if pr.Err() != nil {
			// The round ends here: its other messages on pr get no
			// result, and the next round may replace pr.
			_ = r.failedInRound()
		}
		return fmt.Errorf("publish to stream %s: %w", pr.stream, err)
	}
	return nil
}

// failedInRound returns the failure of a producer that a message published
// through r and without a result is on (nil when none), and forgets that
// producer's messages: the caller ends its round (they get no result and
// are published again), so that the next round may replace the producer.
func (r *Router) failedInRound() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var failed error
	for pr := range r.pending {
		if err := pr.Err(); err != nil {
			failed = err
			delete(r.pending, pr)
		}
	}
	if failed != nil && len(r.pending) == 0 {
		r.idleLocked()
	}
	return failed
}

// done counts one result of pr (or a message it did not send).
func (r *Router) done(pr *Producer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.pending[pr]
	if !ok {
		return // pr failed and was forgotten (Flush)
	}
	if n <= 1 {
		delete(r.pending, pr)
	} else {
		r.pending[pr] = n - 1
	}
	r.idleLocked()
}

func (r *Router) idleLocked() {
	if len(r.pending) == 0 {
		close(r.idle)
		r.idle = make(chan struct{})
	}
}

// flushCheck is how often Flush looks for a failed producer.
const flushCheck = 100 * time.Millisecond

// Flush waits until every message published through r has its result; it
// returns a producer's failure (whose messages then get no result: the
// producer is forgotten, and the caller publishes them again), or ctx's
// error.
func (r *Router) Flush(ctx context.Context) error {
	for {
		r.mu.Lock()
		var failed error
		for pr := range r.pending {
			if err := pr.Err(); err != nil {
				failed = err
				delete(r.pending, pr)
			}
		}
		n, idle := len(r.pending), r.idle
		if failed != nil && n == 0 {
			r.idleLocked()
		}
		r.mu.Unlock()
		if failed != nil {
			return failed
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
