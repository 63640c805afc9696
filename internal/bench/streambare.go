package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"

	samqp "github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// bareStreams is the ceiling the relay's stream destination is measured
// against: rabbitmq-stream-go-client alone, no retention, ids from a
// database or reconnects. It has one producer per partition stream of its
// Config, named (as the relay's are, so the broker keeps the same
// deduplication state) "bench-bare-<i>", with the client's batch size set
// as the relay sets it (the window, at least 100), and at most window
// unconfirmed messages each: the relay's per-partition --confirm-window.
// Partition i's messages carry publishing ids 1, 2, …: the streams must be
// new. send may be called for a partition from one goroutine at a time;
// the owner ends it with close.
type bareStreams struct {
	env    *stream.Environment
	prods  []*stream.Producer
	window []chan struct{} // one token per unconfirmed message, per partition
	next   []int64         // the last publishing id sent, per partition
	loops  sync.WaitGroup  // the confirmation loops; they end when close closes the producers

	mu     sync.Mutex
	err    error
	failed chan struct{} // closed at the first message not confirmed
}

// openBareStreams opens the bare producers on the partition streams of cfg.
func openBareStreams(cfg streams.Config, window int) (*bareStreams, error) {
	env, err := streams.Environment(cfg)
	if err != nil {
		return nil, fmt.Errorf("bare stream producer: %w", err)
	}
	s := &bareStreams{env: env, failed: make(chan struct{})}
	for i := range cfg.Partitions {
		name := fmt.Sprintf("bench-bare-%d", i)
		p, err := env.NewProducer(cfg.PartitionName(i), stream.NewProducerOptions().SetProducerName(name).
			SetClientProvidedName(name).SetBatchSize(min(streams.MaxWindow, max(100, window))))
		if err != nil {
			s.close()
			return nil, fmt.Errorf("bare stream producer: open %s on %s: %w", name, cfg.PartitionName(i), err)
		}
		tokens := make(chan struct{}, window)
		s.prods, s.window, s.next = append(s.prods, p), append(s.window, tokens), append(s.next, 0)
		s.loops.Add(1)
		go s.confirmations(i, p.NotifyPublishConfirmation(), tokens)
	}
	return s, nil
}

// confirmations frees a window slot per confirmed message of partition i
// and fails the producer at the first message not confirmed. It reads
// until the client closes the channel (the producer's close): the client
// blocks on it otherwise.
func (s *bareStreams) confirmations(i int, confirms stream.ChannelPublishConfirm, tokens chan struct{}) {
	defer s.loops.Done()
	for batch := range confirms {
		for _, cs := range batch {
			if !cs.IsConfirmed() {
				s.fail(fmt.Errorf("partition %d: publishing id %d not confirmed: %v", i, cs.GetPublishingId(), cs.GetError()))
			}
			select {
			case <-tokens:
			default:
			}
		}
	}
}

func (s *bareStreams) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
		close(s.failed)
	}
}

func (s *bareStreams) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// send publishes m into partition i with the partition's next publishing
// id, once fewer than window of the partition's messages are unconfirmed.
// It returns ctx's error when ctx ends first, and the producer's failure
// once there is one.
func (s *bareStreams) send(ctx context.Context, i int, m *samqp.AMQP10) error {
	select {
	case s.window[i] <- struct{}{}:
	case <-s.failed:
		return s.failure()
	case <-ctx.Done():
		return ctx.Err()
	}
	s.next[i]++
	m.SetPublishingId(s.next[i])
	if err := s.prods[i].Send(m); err != nil {
		return fmt.Errorf("bare stream producer: send to partition %d: %w", i, err)
	}
	return nil
}

// flush waits until every message sent is confirmed (it takes every
// window slot: nothing may be sent after it).
func (s *bareStreams) flush(ctx context.Context) error {
	for i := range s.window {
		if err := s.flush1(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// flush1 is flush for partition i alone.
func (s *bareStreams) flush1(ctx context.Context, i int) error {
	tokens := s.window[i]
	for range cap(tokens) {
		select {
		case tokens <- struct{}{}:
		case <-s.failed:
			return s.failure()
		case <-ctx.Done():
			return fmt.Errorf("bare stream producer: wait for the confirms of partition %d: %w", i, ctx.Err())
		}
	}
	return s.failure()
}

// close closes the producers (which ends the confirmation loops), waits
// for the loops, and closes the connection.
func (s *bareStreams) close() {
	for _, p := range s.prods {
		if err := p.Close(); err != nil && !errors.Is(err, stream.AlreadyClosed) {
			s.fail(fmt.Errorf("bare stream producer: close: %w", err))
		}
	}
	s.loops.Wait()
	_ = s.env.Close()
}

// streamShaped is message i as the relay writes a row into the streams
// (docs/wire.md, "The stream destination"): streams.Encode of the AMQP
// message relayShaped builds, sent to exchange with routing key key. The
// publishing id is send's.
func streamShaped(id string, i int, partitionKey string, payload []byte, exchange, key string) *samqp.AMQP10 {
	return streams.Encode(publish.Message{Exchange: exchange, RoutingKey: key, Publishing: relayShaped(id, i, partitionKey, payload)}, 0)
}
