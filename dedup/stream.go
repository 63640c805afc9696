package dedup

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	samqp "github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// StreamOffsetsTable holds a StreamConsumer's offset per (consumer,
// partition stream) and the fencing epoch of the partition's owner
// (docs/tables.md; created by `outbox-relay migrate`).
const StreamOffsetsTable = "stream_consumer_offsets"

// Defaults of the StreamConsumer's zero fields.
const (
	DefaultStreamCredits = 32
	DefaultCheckInterval = 500 * time.Millisecond
)

// streamBuffer is how many messages of a partition wait, decoded, for its
// worker; the subscription's callback blocks when it is full, and the
// broker's credits follow.
const streamBuffer = 256

// ErrPartitionLost is matched (errors.Is) by the error a partition's work
// ends with when its lock was lost or another process claimed it since:
// the process stops reading it at once and commits nothing more there.
var ErrPartitionLost = errors.New("partition lost")

// StreamMessage is one message read from a partition stream, with where it
// was read. Delivery is the message as the AMQP delivery it stands for
// (docs/wire.md, the stream destination, read backwards): MessageId,
// Type (subject), ContentType, Timestamp (creation-time), Headers (the
// application properties but x-exchange and x-routing-key), Exchange and
// RoutingKey (those two), Body. Delivery has no channel: it cannot be acked.
type StreamMessage struct {
	Stream    string         // the partition stream, NAME-i
	Partition int            // i
	Offset    int64          // the message's offset in Stream
	Delivery  amqp.Delivery  // the message's fields
	Raw       *samqp.Message // the message as the stream client decoded it
}

// StreamHandler does the database work of one stream message in tx, the
// transaction that also stores the partition's offset past it. It must not
// commit or roll back tx; returning an error rolls back its writes and the
// offset, and the same message is tried again.
type StreamHandler func(ctx context.Context, tx *sql.Tx, m StreamMessage) error

// StreamConsumer reads the partition streams Stream-0 … Stream-(Partitions-1)
// of the relay's stream destination (docs/wire.md) and runs a handler per
// message in a database transaction of the Inbox's database that also
// stores, in stream_consumer_offsets, the offset after the message for
// (Inbox's consumer name, partition stream). A restart resumes at the stored
// offset, so each message's effect commits exactly once, in stream order,
// without a message_deduplication row per message.
//
// One process per partition at a time: a process works on a partition only
// while it holds the partition's lock (GET_LOCK on a connection of its
// own, see StreamLockName), checked every CheckInterval; losing it stops
// the partition at once. The lock alone cannot stop a transaction that is
// already under way, so every offset write is also fenced: a claim raises
// the row's epoch, and a write whose epoch is no longer the row's commits
// nothing (the whole transaction rolls back and the partition stops with
// ErrPartitionLost). Several processes of one consumer share the
// partitions: each registers in one of Partitions member slots (also a
// lock), takes free partitions up to its share (Partitions divided by the
// registered processes, rounded up) and gives back what exceeds it, one per
// CheckInterval; a process beyond Partitions waits for a slot. When a
// process dies its database connections close, the server frees its locks,
// and the others take its partitions within a CheckInterval.
//
// Failures: a handler error (or a database error) rolls back and the same
// message is tried again after RetryDelay, keeping the partition's order;
// the attempt that reaches MaxAttempts (counted in memory by the owning
// process) copies the message into outbox_failed (source 'inbox') in the
// transaction that moves the offset past it. A message-id that is not a
// UUID and a type with no handler go to outbox_failed at once, likewise.
//
// Set the fields, then call Run; do not change them while Run runs.
type StreamConsumer struct {
	// Inbox gives the database, the consumer name (the offsets' key) and
	// the isolation level of the handlers' transactions. Required.
	Inbox *Inbox
	// Stream is the super stream's name: the partitions are Stream-0 …
	// Stream-(Partitions-1). Required.
	Stream string
	// Partitions is the number of partition streams (the relay's
	// --stream-partitions). Required.
	Partitions int
	// Handlers maps a message type (subject) to its handler.
	Handlers map[string]StreamHandler
	// Unknown, when set, handles the types Handlers lacks; when nil such a
	// message goes to outbox_failed with `no handler for message type "T"`.
	Unknown StreamHandler
	// MaxAttempts is how many failed attempts a message gets before it goes
	// to outbox_failed. 0 means DefaultMaxAttempts.
	MaxAttempts int
	// RetryDelay is the pause before a failed message is tried again. 0
	// means DefaultRetryDelay; negative means none.
	RetryDelay time.Duration
	// Credits is how many chunks the broker sends a partition's
	// subscription ahead. 0 means DefaultStreamCredits.
	Credits int
	// CheckInterval is how often the locks are checked and the partitions
	// rebalanced. 0 means DefaultCheckInterval.
	CheckInterval time.Duration
	// Instance names this process in the offsets' owner column; "" means
	// the host-independent random name Run makes.
	Instance string
	// Deduplicate also records each message in message_deduplication, in
	// the same transaction, and skips (moving the offset past it) a message
	// whose id the consumer recorded before: for the cases where the relay
	// delivers at least once and a message can be in a stream twice, at two
	// offsets (docs/operations.md, "The stream destination"). Off, the
	// offset alone gives each stream entry's effect once.
	Deduplicate bool
	// Logger receives claims and releases (Info), failures (Warn) and
	// messages given up on (Error). nil means no logging.
	Logger *slog.Logger
	// TracerProvider makes the consumer span each message's handling
	// (every attempt) runs in: "process <partition stream>", kind
	// consumer, a child of (and linked to) the producer's span read from
	// the message's traceparent, tracestate and baggage, as Consumer's.
	// nil means the global otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from the application properties.
	// nil means outbox.DefaultPropagator().
	Propagator propagation.TextMapPropagator

	stats struct{ processed, duplicates, retried, failed, claims, losses atomic.Int64 }
	mu    sync.Mutex
	held  []int // partitions held now, for Held
	// beforeOffset, when set (by tests), runs in a message's transaction
	// before the fenced offset write.
	beforeOffset func(StreamMessage)
}

// StreamStats counts what a StreamConsumer did, over all its Runs.
type StreamStats struct {
	Processed  int64 // handler ran and committed with the offset
	Duplicates int64 // with Deduplicate: recorded before, skipped, offset moved past
	Retried    int64 // failed attempts that were tried again
	Failed     int64 // copied to outbox_failed with the offset moved past
	Claims     int64 // partitions claimed
	Losses     int64 // partitions whose lock or epoch was lost
}

// Stats returns the counts so far.
func (c *StreamConsumer) Stats() StreamStats {
	return StreamStats{
		Processed:  c.stats.processed.Load(),
		Duplicates: c.stats.duplicates.Load(),
		Retried:    c.stats.retried.Load(),
		Failed:     c.stats.failed.Load(),
		Claims:     c.stats.claims.Load(),
		Losses:     c.stats.losses.Load(),
	}
}

// Held returns the partitions this consumer works on now, in order.
func (c *StreamConsumer) Held() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.held)
}

// PartitionStream is the name of partition i of the super stream name:
// name-i, as the relay and the super-stream clients name it.
func PartitionStream(name string, i int) string { return name + "-" + strconv.Itoa(i) }

// StreamLockName is the GET_LOCK name a StreamConsumer holds while it works
// on partition stream partitionStream for consumer: "outbox-stream:" and 48
// hex digits of SHA-256 over consumer, a zero byte and partitionStream (63
// characters: MySQL refuses lock names over 64; the prefix keeps them apart
// from the relay's "outbox-relay:<name>" locks).
func StreamLockName(consumer, partitionStream string) string {
	return lockName("outbox-stream:", consumer+"\x00"+partitionStream)
}

// streamMemberLockName is the lock of member slot k of consumer's
// processes over the super stream superStream.
func streamMemberLockName(consumer, superStream string, k int) string {
	return lockName("outbox-stmem:", consumer+"\x00"+superStream+"\x00"+strconv.Itoa(k))
}

func lockName(prefix, key string) string {
	sum := sha256.Sum256([]byte(key))
	return prefix + hex.EncodeToString(sum[:])[:63-len(prefix)]
}

// share is how many of partitions each of members processes should hold:
// partitions / members rounded up (at least 1 member: the caller).
func share(partitions, members int) int {
	if members < 1 {
		members = 1
	}
	return (partitions + members - 1) / members
}

// Run works on the partitions this process can claim until ctx ends, and
// returns nil then; it returns an error only for bad settings or when env
// is closed. The caller owns env (the stream-protocol connections). Each
// claimed partition is read from its stored offset (the first message for
// a partition the consumer never read) by a subscription of its own.
//
// Stop: when ctx ends Run closes the subscriptions, lets the transactions
// under way finish (a handler runs on a context that does not end with
// ctx, so a transaction is never cut in the middle; a handler that may
// block must bound itself), releases the locks and returns.
func (c *StreamConsumer) Run(ctx context.Context, env *stream.Environment) error {
	if err := c.check(); err != nil {
		return err
	}
	instance := c.Instance
	if instance == "" {
		var b [8]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
		instance = "stream-consumer-" + hex.EncodeToString(b[:])
	}
	interval := c.CheckInterval
	if interval == 0 {
		interval = DefaultCheckInterval
	}
	r := &streamRun{c: c, env: env, instance: instance, parts: map[int]*partition{}}
	defer r.stopAll()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if env.IsClosed() {
			return fmt.Errorf("dedup: stream consumer %q: the stream environment is closed", c.Inbox.consumer)
		}
		r.tick(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (c *StreamConsumer) check() error {
	if c.Inbox == nil || c.Stream == "" || c.Partitions <= 0 {
		return errors.New("dedup: StreamConsumer needs an Inbox, a Stream and Partitions > 0")
	}
	if err := checkName("consumer name", c.Inbox.consumer); err != nil {
		return fmt.Errorf("dedup: %w", err)
	}
	if c.MaxAttempts < 0 || c.Credits < 0 || c.CheckInterval < 0 || c.Credits > 1000 {
		return fmt.Errorf("dedup: stream consumer %q: MaxAttempts, Credits and CheckInterval must not be negative (Credits at most 1000)", c.Inbox.consumer)
	}
	return nil
}

// streamRun is one Run's state; only Run's goroutine touches it.
type streamRun struct {
	c        *StreamConsumer
	env      *stream.Environment
	instance string
	member   *sql.Conn // holds this process's member slot lock; nil: none yet
	slot     int
	parts    map[int]*partition
}

// tick checks the member slot, reaps partitions that ended, and claims or
// gives back partitions towards this process's share.
func (r *streamRun) tick(ctx context.Context) {
	c := r.c
	for i, p := range r.parts {
		select {
		case <-p.done:
			r.release(i)
		default:
		}
	}
	if ctx.Err() != nil {
		return
	}
	if r.member != nil && !lockHeld(ctx, r.member, streamMemberLockName(c.Inbox.consumer, c.Stream, r.slot)) {
		c.log(slog.LevelWarn, "member slot lock lost; giving back every partition", slog.Int("slot", r.slot))
		r.stopAll()
	}
	if r.member == nil && !r.join(ctx) {
		return // every slot taken: a standby
	}
	members, free, err := r.survey(ctx)
	if err != nil {
		c.log(slog.LevelWarn, "read the partitions' locks", slog.Any("error", err))
		return
	}
	want := share(c.Partitions, members)
	if len(r.parts) > want {
		// Give back the partition claimed last, one per tick, so the
		// others see it free and no partition is left without a reader for
		// long.
		last := -1
		for i, p := range r.parts {
			if last < 0 || p.seq > r.parts[last].seq {
				last = i
			}
		}
		c.log(slog.LevelInfo, "giving back a partition", slog.Int("partition", last), slog.Int("share", want))
		r.release(last)
		return
	}
	for _, i := range free {
		if len(r.parts) >= want {
			break
		}
		if err := r.claim(ctx, i); err != nil && !errors.Is(err, errTaken) {
			c.log(slog.LevelWarn, "claim a partition", slog.Int("partition", i), slog.Any("error", err))
		}
	}
}

// join takes a free member slot; false when there is none.
func (r *streamRun) join(ctx context.Context) bool {
	c := r.c
	for k := 0; k < c.Partitions; k++ {
		conn, err := takeLock(ctx, c.Inbox.db, streamMemberLockName(c.Inbox.consumer, c.Stream, k))
		if err != nil {
			if !errors.Is(err, errTaken) {
				c.log(slog.LevelWarn, "take a member slot", slog.Any("error", err))
				return false
			}
			continue
		}
		r.member, r.slot = conn, k
		return true
	}
	return false
}

// survey returns how many member slots are taken and which partitions no
// process holds (not this one's either).
func (r *streamRun) survey(ctx context.Context) (members int, free []int, err error) {
	c := r.c
	q := "SELECT "
	args := make([]any, 0, 2*c.Partitions)
	for k := 0; k < c.Partitions; k++ {
		q += "IS_USED_LOCK(?) IS NOT NULL, "
		args = append(args, streamMemberLockName(c.Inbox.consumer, c.Stream, k))
	}
	for i := 0; i < c.Partitions; i++ {
		if i > 0 {
			q += ", "
		}
		q += "IS_USED_LOCK(?) IS NOT NULL"
		args = append(args, StreamLockName(c.Inbox.consumer, PartitionStream(c.Stream, i)))
	}
	used := make([]bool, 2*c.Partitions)
	dest := make([]any, len(used))
	for i := range used {
		dest[i] = &used[i]
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Inbox.db.QueryRowContext(qctx, q, args...).Scan(dest...); err != nil {
		return 0, nil, err
	}
	for k := 0; k < c.Partitions; k++ {
		if used[k] {
			members++
		}
	}
	for i := 0; i < c.Partitions; i++ {
		if !used[c.Partitions+i] && r.parts[i] == nil {
			free = append(free, i)
		}
	}
	return members, free, nil
}

// errTaken is takeLock's error for a lock another connection holds.
var errTaken = errors.New("lock held by another connection")

// takeLock takes the named lock without waiting on a connection of its own,
// which it returns; errTaken when another connection holds the lock.
func takeLock(ctx context.Context, db *sql.DB, name string) (*sql.Conn, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := db.Conn(qctx)
	if err != nil {
		return nil, fmt.Errorf("open the lock connection: %w", err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(qctx, "SELECT GET_LOCK(?, 0)", name).Scan(&got); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		conn.Close()
		return nil, fmt.Errorf("GET_LOCK(%q): %w", name, err)
	}
	if got.Int64 != 1 {
		conn.Close()
		return nil, errTaken
	}
	return conn, nil
}

// lockHeld reports whether conn still holds the named lock: the connection
// answers and the lock's holder is its own connection id.
func lockHeld(ctx context.Context, conn *sql.Conn, name string) bool {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var mine sql.NullBool
	err := conn.QueryRowContext(qctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", name).Scan(&mine)
	return err == nil && mine.Valid && mine.Bool
}

// dropLock releases the named lock (RELEASE_LOCK, so another process
// sees it free at once) and closes its connection without pooling it again
// (the server frees a connection's locks when it ends, which covers a
// connection that no longer answers).
func dropLock(conn *sql.Conn, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = conn.ExecContext(ctx, "DO RELEASE_LOCK(?)", name)
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// claim takes partition i: its lock, then a new epoch in its offsets row,
// then a subscription from the stored offset.
func (r *streamRun) claim(ctx context.Context, i int) error {
	c := r.c
	name := PartitionStream(c.Stream, i)
	conn, err := takeLock(ctx, c.Inbox.db, StreamLockName(c.Inbox.consumer, name))
	if err != nil {
		return err
	}
	epoch, next, err := c.claimRow(ctx, name, r.instance)
	if err != nil {
		dropLock(conn, StreamLockName(c.Inbox.consumer, name))
		return err
	}
	p := &partition{c: c, index: i, stream: name, lock: conn, epoch: epoch, next: next,
		done: make(chan struct{}), seq: c.stats.claims.Add(1)}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	if err := p.subscribe(pctx, r.env); err != nil {
		cancel()
		dropLock(conn, StreamLockName(c.Inbox.consumer, name))
		return err
	}
	r.parts[i] = p
	c.setHeld(r.parts)
	c.log(slog.LevelInfo, "claimed a partition", slog.String("stream", name), slog.Uint64("epoch", epoch), slog.Int64("offset", next))
	go p.run(pctx)
	return nil
}

// claimRow raises the epoch of the offsets row of partition stream name
// (creating it at offset 0) and returns the new epoch and the stored
// offset. It waits for a transaction of the previous owner that holds the
// row, so the offset read is the last one committed.
func (c *StreamConsumer) claimRow(ctx context.Context, name, instance string) (epoch uint64, next int64, err error) {
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tx, err := c.Inbox.db.BeginTx(qctx, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("dedup: stream consumer %q, %s: claim: begin: %w", c.Inbox.consumer, name, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(qctx, "INSERT INTO "+StreamOffsetsTable+
		` (consumer, stream, next_offset, epoch, owner, claimed_at, updated_at)
		VALUES (?, ?, 0, 1, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
		ON DUPLICATE KEY UPDATE epoch = epoch + 1, owner = ?, claimed_at = UTC_TIMESTAMP(6)`,
		c.Inbox.consumer, name, instance, instance); err != nil {
		return 0, 0, fmt.Errorf("dedup: stream consumer %q, %s: claim: %w", c.Inbox.consumer, name, err)
	}
	if err := tx.QueryRowContext(qctx, "SELECT epoch, next_offset FROM "+StreamOffsetsTable+
		" WHERE consumer = ? AND stream = ?", c.Inbox.consumer, name).Scan(&epoch, &next); err != nil {
		return 0, 0, fmt.Errorf("dedup: stream consumer %q, %s: claim: read the offset: %w", c.Inbox.consumer, name, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, fmt.Errorf("dedup: stream consumer %q, %s: claim: commit: %w", c.Inbox.consumer, name, err)
	}
	return epoch, next, nil
}

// release stops partition i, waits for its transaction under way, and
// frees its lock.
func (r *streamRun) release(i int) {
	p := r.parts[i]
	p.stop()
	dropLock(p.lock, StreamLockName(r.c.Inbox.consumer, p.stream))
	delete(r.parts, i)
	r.c.setHeld(r.parts)
	if p.err != nil && !errors.Is(p.err, context.Canceled) {
		r.c.log(slog.LevelWarn, "partition stopped", slog.String("stream", p.stream), slog.Any("error", p.err))
	}
}

// stopAll gives back every partition and the member slot.
func (r *streamRun) stopAll() {
	for i := range r.parts {
		r.release(i)
	}
	if r.member != nil {
		dropLock(r.member, streamMemberLockName(r.c.Inbox.consumer, r.c.Stream, r.slot))
		r.member = nil
	}
}

func (c *StreamConsumer) setHeld(parts map[int]*partition) {
	held := make([]int, 0, len(parts))
	for i := range parts {
		held = append(held, i)
	}
	slices.Sort(held)
	c.mu.Lock()
	c.held = held
	c.mu.Unlock()
}

// partition is the work on one claimed partition stream: a subscription
// whose callback hands messages to run, which processes them one by one.
type partition struct {
	c      *StreamConsumer
	index  int
	stream string
	lock   *sql.Conn // holds StreamLockName; run checks it, release closes it
	epoch  uint64    // this claim's epoch: the offset writes' fence
	next   int64     // offset of the next message to process
	seq    int64     // claim order, to give back the newest first

	sub    *stream.Consumer
	msgs   chan StreamMessage
	cancel context.CancelFunc
	done   chan struct{} // closed when run returned
	err    error         // why run returned; read after done
}

// subscribe opens the subscription from p.next. The client calls the
// callback on its own goroutine, one message after the other; the callback
// waits for room in p.msgs (so the broker's credits follow the processing)
// or for ctx's end.
func (p *partition) subscribe(ctx context.Context, env *stream.Environment) error {
	credits := p.c.Credits
	if credits == 0 {
		credits = DefaultStreamCredits
	}
	p.msgs = make(chan StreamMessage, streamBuffer)
	sub, err := env.NewConsumer(p.stream, func(cc stream.ConsumerContext, m *samqp.Message) {
		sm := StreamMessage{Stream: p.stream, Partition: p.index, Offset: cc.Consumer.GetOffset(),
			Delivery: StreamDelivery(m), Raw: m}
		select {
		case p.msgs <- sm:
		case <-ctx.Done():
		}
	}, stream.NewConsumerOptions().
		SetOffset(stream.OffsetSpecification{}.Offset(p.next)).
		SetManualCommit().
		SetInitialCredits(int16(credits)).
		SetClientProvidedName("dedup-"+p.c.Inbox.consumer))
	if err != nil {
		return fmt.Errorf("dedup: stream consumer %q: subscribe to %s at offset %d: %w", p.c.Inbox.consumer, p.stream, p.next, err)
	}
	p.sub = sub
	return nil
}

// stop ends run and waits for it.
func (p *partition) stop() {
	p.cancel()
	<-p.done
}

// run processes the partition's messages until ctx ends, the lock is lost,
// the fence refuses a write, or the subscription closes; p.err says which.
func (p *partition) run(ctx context.Context) {
	defer close(p.done)
	defer func() { _ = p.sub.Close() }()
	interval := p.c.CheckInterval
	if interval == 0 {
		interval = DefaultCheckInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	closed := p.sub.NotifyClose()
	lock := StreamLockName(p.c.Inbox.consumer, p.stream)
	for {
		select {
		case <-ctx.Done():
			p.err = ctx.Err()
			return
		case ev := <-closed:
			p.err = fmt.Errorf("dedup: stream consumer %q: subscription to %s closed: %v", p.c.Inbox.consumer, p.stream, ev.Reason)
			return
		case <-t.C:
			if !lockHeld(ctx, p.lock, lock) {
				p.c.stats.losses.Add(1)
				p.err = fmt.Errorf("dedup: stream consumer %q, %s: %w: its lock connection is gone or no longer holds %s",
					p.c.Inbox.consumer, p.stream, ErrPartitionLost, lock)
				return
			}
		case m := <-p.msgs:
			if m.Offset < p.next {
				continue // before the stored offset: committed already
			}
			if err := p.process(ctx, m); err != nil {
				p.err = err
				return
			}
		}
	}
}

// process handles m until it commits (processed, or moved to
// outbox_failed); an error means the partition must stop.
func (p *partition) process(ctx context.Context, m StreamMessage) (err error) {
	c := p.c
	work, span := c.startSpan(context.WithoutCancel(ctx), m)
	defer func() {
		if err != nil {
			spanFailed(work, err)
		}
		span.End()
	}()
	h, reason := c.handlerFor(m)
	for attempt := int64(1); ; attempt++ {
		var err error
		if h == nil {
			err = p.commit(work, m, nil, 0, "", reason)
		} else {
			err = p.commit(work, m, h, 0, "", "")
		}
		if err == nil || errors.Is(err, ErrPartitionLost) {
			if err == nil {
				p.next = m.Offset + 1
			}
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if maxAttempts := int64(orDefault(c.MaxAttempts, DefaultMaxAttempts)); attempt >= maxAttempts {
			c.log(slog.LevelError, "message failed; moving it to "+FailedTable, slog.String("stream", p.stream),
				slog.Int64("offset", m.Offset), slog.String("message_id", m.Delivery.MessageId), slog.Any("error", err))
			spanFailed(work, err)
			gerr := p.commit(work, m, nil, attempt, err.Error(),
				fmt.Sprintf("consumer %q: %d failed attempts, the last: %v", c.Inbox.consumer, attempt, err))
			if gerr == nil {
				p.next = m.Offset + 1
				return nil
			}
			if errors.Is(gerr, ErrPartitionLost) {
				return gerr
			}
			err = gerr
		}
		c.stats.retried.Add(1)
		trace.SpanFromContext(work).RecordError(err)
		c.log(slog.LevelWarn, "message failed; trying it again", slog.String("stream", p.stream),
			slog.Int64("offset", m.Offset), slog.String("message_id", m.Delivery.MessageId), slog.Int64("attempts", attempt), slog.Any("error", err))
		if d := c.RetryDelay; d >= 0 {
			if d == 0 {
				d = DefaultRetryDelay
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
	}
}

// handlerFor returns m's handler, or nil and why m goes to outbox_failed
// without one.
func (c *StreamConsumer) handlerFor(m StreamMessage) (StreamHandler, string) {
	if _, err := outbox.ParseMessageID(m.Delivery.MessageId); err != nil {
		return nil, fmt.Sprintf("message-id %q is not a UUID", m.Delivery.MessageId)
	}
	h := c.Handlers[m.Delivery.Type]
	if h == nil {
		h = c.Unknown
	}
	if h == nil {
		return nil, fmt.Sprintf("no handler for message type %q", m.Delivery.Type)
	}
	return h, ""
}

// commit moves the partition's offset past m in one transaction with either
// h's work (h != nil) or m's copy in outbox_failed (h == nil, with reason).
// The offset write comes first and is fenced by p.epoch: when it updates no
// row, another process claimed the partition, and commit rolls back and
// returns ErrPartitionLost.
func (p *partition) commit(ctx context.Context, m StreamMessage, h StreamHandler, attempts int64, lastErr, reason string) error {
	c := p.c
	tx, err := c.Inbox.db.BeginTx(ctx, c.Inbox.txOpts)
	if err != nil {
		return fmt.Errorf("dedup: stream consumer %q, %s offset %d: begin: %w", c.Inbox.consumer, p.stream, m.Offset, err)
	}
	defer tx.Rollback()
	if c.beforeOffset != nil {
		c.beforeOffset(m)
	}
	res, err := tx.ExecContext(ctx, "UPDATE "+StreamOffsetsTable+
		" SET next_offset = ?, updated_at = UTC_TIMESTAMP(6) WHERE consumer = ? AND stream = ? AND epoch = ? AND next_offset <= ?",
		m.Offset+1, c.Inbox.consumer, p.stream, p.epoch, m.Offset)
	if err != nil {
		return fmt.Errorf("dedup: stream consumer %q, %s offset %d: store the offset: %w", c.Inbox.consumer, p.stream, m.Offset, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("dedup: stream consumer %q, %s offset %d: store the offset: %w", c.Inbox.consumer, p.stream, m.Offset, err)
	} else if n != 1 {
		c.stats.losses.Add(1)
		return fmt.Errorf("dedup: stream consumer %q, %s offset %d: %w: the offsets row has another epoch than %d (claimed by another process)",
			c.Inbox.consumer, p.stream, m.Offset, ErrPartitionLost, p.epoch)
	}
	duplicate := false
	if h != nil && c.Deduplicate {
		id, _ := outbox.ParseMessageID(m.Delivery.MessageId) // a UUID: handlerFor checked
		_, err := tx.ExecContext(ctx, "INSERT INTO "+DedupTable+
			" (consumer, message_id, message_name, processed_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6))",
			c.Inbox.consumer, id[:], truncate(m.Delivery.Type, MaxNameLen))
		switch {
		case mysqlCode(err) == errDupEntry:
			duplicate = true
		case err != nil:
			return fmt.Errorf("dedup: stream consumer %q, %s offset %d: record message %s: %w", c.Inbox.consumer, p.stream, m.Offset, id, err)
		}
	}
	switch {
	case duplicate:
	case h != nil:
		if err := h(ctx, tx, m); err != nil {
			return err
		}
	default:
		id, _ := outbox.ParseMessageID(m.Delivery.MessageId) // zero when not a UUID
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+FailedTable+
			` (outbox_id, message_id, partition_key, exchange, routing_key, message_type, headers, payload,
			content_type, created_at, attempts, last_error, error, source, failed_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'inbox', UTC_TIMESTAMP(6))`,
			failedRow(m.Delivery, id, attempts, lastErr, reason)...); err != nil {
			return fmt.Errorf("dedup: stream consumer %q, %s offset %d: move to %s: %w", c.Inbox.consumer, p.stream, m.Offset, FailedTable, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("dedup: stream consumer %q, %s offset %d: commit: %w", c.Inbox.consumer, p.stream, m.Offset, err)
	}
	switch {
	case duplicate:
		c.stats.duplicates.Add(1)
	case h != nil:
		c.stats.processed.Add(1)
	default:
		c.stats.failed.Add(1)
	}
	return nil
}

// StreamDelivery is the AMQP delivery a message of the relay's partition
// streams stands for (docs/wire.md, the stream destination): message-id,
// subject as type, content-type, creation-time as timestamp, the
// application properties as headers (x-exchange and x-routing-key as the
// delivery's exchange and routing key), the body. StreamConsumer hands
// handlers this delivery; code that reads the streams itself can use it to
// handle both destinations alike.
func StreamDelivery(m *samqp.Message) amqp.Delivery {
	var d amqp.Delivery
	if p := m.Properties; p != nil {
		if id, ok := p.MessageID.(string); ok {
			d.MessageId = id
		}
		d.Type, d.ContentType = p.Subject, p.ContentType
		if !p.CreationTime.IsZero() {
			d.Timestamp = p.CreationTime.UTC()
		}
	}
	d.DeliveryMode = amqp.Persistent
	d.Headers = amqp.Table{}
	for k, v := range m.ApplicationProperties {
		switch k {
		case "x-exchange":
			d.Exchange, _ = v.(string)
		case "x-routing-key":
			d.RoutingKey, _ = v.(string)
		default:
			d.Headers[k] = v
		}
	}
	for _, b := range m.Data {
		d.Body = append(d.Body, b...)
	}
	return d
}

func (c *StreamConsumer) log(level slog.Level, msg string, attrs ...slog.Attr) {
	if c.Logger == nil {
		return
	}
	attrs = append(attrs, slog.String("consumer", c.Inbox.consumer), slog.String("super_stream", c.Stream))
	c.Logger.LogAttrs(context.Background(), level, msg, attrs...)
}
