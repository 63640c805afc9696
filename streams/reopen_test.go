package streams

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Finding 6: a producer that failed (a message not confirmed, its
// connection lost) under a Router, as the due-time sweep's producers do in
// a term that goes on, is replaced at the Router's next publish by a new
// producer of the same name numbering above everything the failed one
// sent, so the sweep's next round delivers instead of failing for the rest
// of the term; the failed producer's unresolved messages no longer hold
// Flush.
func TestRouterReopensAFailedProducer(t *testing.T) {
	t.Parallel()
	b := testenv.RabbitMQ(t)
	u, err := FromAMQP(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Stream: fmt.Sprintf("test-reopen-%d", time.Now().UnixNano()), Partitions: 1, URL: u, Producer: "d", Window: 4}
	pub, err := DialTerm(cfg, NewIssued(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if _, err := pub.Declare(); err != nil {
		t.Fatal(err)
	}
	testenv.DeleteStreamsAtCleanup(t, u, cfg.PartitionName(0))
	ctx := testenv.WorkContext(t)
	results := make(chan publish.Result, 16)
	r := pub.NewRouter("d", "-delayed", func(res publish.Result) { results <- res })
	send := func(id string) error {
		var m publish.Message
		m.Publishing.MessageId = id
		if err := r.Publish(ctx, m); err != nil {
			return err
		}
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return r.Flush(fctx)
	}
	if err := send("m1"); err != nil {
		t.Fatal(err)
	}
	<-results
	pub.mu.Lock()
	old := pub.producers["d-0-delayed"]
	pub.mu.Unlock()
	// A message of the old producer that never gets its result, then the
	// producer fails.
	old.mu.Lock()
	old.tags[int64(old.last+1)] = waiting{cb: func(publish.Result) {}}
	old.mu.Unlock()
	r.mu.Lock()
	r.pending[old]++
	r.mu.Unlock()
	old.fail(errors.New("injected: a message not confirmed"))
	if err := r.Flush(ctx); !errors.Is(err, ErrFailed) {
		t.Fatalf("Flush after the failure: %v, want the producer's failure", err)
	}

	// The next round: a new producer, numbering above the failed one.
	if err := send("m2"); err != nil {
		t.Fatalf("publish after a producer failed: %v (the due-time sweep would stall)", err)
	}
	if res := <-results; res.Outcome != publish.Confirmed {
		t.Fatalf("m2: %+v", res)
	}
	pub.mu.Lock()
	cur := pub.producers["d-0-delayed"]
	pub.mu.Unlock()
	if cur == old || cur.Last() <= old.Last() {
		t.Fatalf("producer after the failure: same %v, last id %d (failed one's %d)", cur == old, cur.Last(), old.Last())
	}
}
