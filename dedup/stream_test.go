package dedup_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	samqp "github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/dedup"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/streams"
)

// Environment of a stream consumer process: the test binary run again with
// streamChildEnv set runs streamChild instead of the tests.
const (
	streamChildEnv      = "DEDUP_TEST_STREAM_CHILD" // the instance name
	streamChildDSN      = "DEDUP_TEST_STREAM_DSN"
	streamChildURL      = "DEDUP_TEST_STREAM_URL"
	streamChildStream   = "DEDUP_TEST_STREAM_NAME"
	streamChildConsumer = "DEDUP_TEST_STREAM_CONSUMER"
	streamChildParts    = "DEDUP_TEST_STREAM_PARTITIONS"
)

// streamEffectsTable is where the consumer processes' handler writes one
// row per run. message_id is unique so a second effect of a message fails
// loudly (and is recorded in stream_doubles); the test counts rows anyway.
const streamEffectsTable = `CREATE TABLE stream_effects (
	id         BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
	message_id BINARY(16)   NOT NULL,
	pkey       VARCHAR(64)  NOT NULL,
	seq        BIGINT       NOT NULL,
	instance   VARCHAR(64)  NOT NULL,
	stream     VARCHAR(255) NOT NULL,
	off        BIGINT       NOT NULL,
	UNIQUE KEY (message_id)
);
CREATE TABLE stream_doubles (
	message_id VARCHAR(36) NOT NULL,
	instance   VARCHAR(64) NOT NULL
)`

// streamChild is a consumer process: a StreamConsumer whose handler writes
// stream_effects, until its stdin closes (the test ended or dropped it).
func streamChild() int {
	instance := os.Getenv(streamChildEnv)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("instance", instance)
	parts, err := strconv.Atoi(os.Getenv(streamChildParts))
	if err != nil {
		log.Error("partitions", "error", err)
		return 2
	}
	db, err := sql.Open("mysql", os.Getenv(streamChildDSN))
	if err != nil {
		log.Error("open the database", "error", err)
		return 2
	}
	defer db.Close()
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(os.Getenv(streamChildURL)))
	if err != nil {
		log.Error("connect to the stream port", "error", err)
		return 2
	}
	defer env.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // owned by stdin: ends when the parent closes it or dies
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	c := &dedup.StreamConsumer{
		Inbox:         dedup.New(db, os.Getenv(streamChildConsumer)),
		Stream:        os.Getenv(streamChildStream),
		Partitions:    parts,
		CheckInterval: 200 * time.Millisecond,
		RetryDelay:    50 * time.Millisecond,
		Instance:      instance,
		Logger:        log,
		Handlers: map[string]dedup.StreamHandler{"test.event": func(ctx context.Context, tx *sql.Tx, m dedup.StreamMessage) error {
			id := uuid.MustParse(m.Delivery.MessageId)
			key, _ := m.Delivery.Headers["x-partition-key"].(string)
			seq, _ := m.Delivery.Headers["seq"].(int64)
			_, err := tx.ExecContext(ctx, "INSERT INTO stream_effects (message_id, pkey, seq, instance, stream, off) VALUES (?, ?, ?, ?, ?, ?)",
				id[:], key, seq, instance, m.Stream, m.Offset)
			var me *mysql.MySQLError
			if errors.As(err, &me) && me.Number == 1062 {
				_, _ = db.ExecContext(ctx, "INSERT INTO stream_doubles VALUES (?, ?)", m.Delivery.MessageId, instance)
			}
			return err
		}},
	}
	if err := c.Run(ctx, env); err != nil {
		log.Error("run", "error", err)
		return 1
	}
	return 0
}

// consumerProc is one consumer process of the test.
type consumerProc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	log   *strings.Builder
	mu    *sync.Mutex
	done  chan struct{}
}

func startConsumerProc(t *testing.T, name string, env []string) *consumerProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, streamChildEnv+"="+name)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &consumerProc{name: name, cmd: cmd, stdin: stdin, log: &strings.Builder{}, mu: &sync.Mutex{}, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // owned by the process: ends when its stderr closes
		defer close(p.done)
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			p.mu.Lock()
			p.log.WriteString(s.Text() + "\n")
			p.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		<-p.done
		if t.Failed() {
			p.mu.Lock()
			t.Logf("consumer %s log:\n%s", name, p.log.String())
			p.mu.Unlock()
		}
	})
	return p
}

// streamMsg is one test message: key and its sequence number in the key.
type streamMsg struct {
	key string
	seq int64
	id  string
	typ string // "" means test.event
}

// publishStreams publishes msgs into the partition streams in the relay's
// format (docs/wire.md), each through its partition's producer, in order,
// and waits for every confirm.
func publishStreams(ctx context.Context, producers []*stream.Producer, confirms []stream.ChannelPublishConfirm, msgs []streamMsg) error {
	batches := make([][]message.StreamMessage, len(producers))
	for _, m := range msgs {
		p := streams.Partition(m.key, m.id, len(producers))
		am := samqp.NewMessage([]byte(fmt.Sprintf(`{"key":%q,"seq":%d}`, m.key, m.seq)))
		typ := m.typ
		if typ == "" {
			typ = "test.event"
		}
		am.Properties = &samqp.MessageProperties{MessageID: m.id, Subject: typ, ContentType: "application/json"}
		am.ApplicationProperties = map[string]any{"x-partition-key": m.key, "seq": m.seq, "x-exchange": "", "x-routing-key": "rk"}
		batches[p] = append(batches[p], am)
	}
	for p, batch := range batches {
		if len(batch) == 0 {
			continue
		}
		if err := producers[p].BatchSend(batch); err != nil {
			return fmt.Errorf("publish into partition %d: %w", p, err)
		}
	}
	for p, batch := range batches {
		sctx, cancel := progress.Step(ctx)
		for got := 0; got < len(batch); {
			select {
			case cs := <-confirms[p]:
				for _, c := range cs {
					if !c.IsConfirmed() {
						cancel()
						return fmt.Errorf("partition %d: message not confirmed: %w", p, c.GetError())
					}
				}
				got += len(cs)
			case <-sctx.Done():
				cancel()
				return fmt.Errorf("partition %d: %d of %d confirms: %w", p, got, len(batch), sctx.Err())
			}
		}
		cancel()
	}
	return nil
}

// partitionStreams declares the partition streams of a super stream named
// after db (deleted at cleanup) and returns the stream URL, the super
// stream's name, and a producer per partition with its confirms.
func partitionStreams(t *testing.T, db *testenv.DB, partitions int) (string, string, []*stream.Producer, []stream.ChannelPublishConfirm) {
	t.Helper()
	senv, url, super := declarePartitions(t, db, partitions)
	producers := make([]*stream.Producer, partitions)
	confirms := make([]stream.ChannelPublishConfirm, partitions)
	for i := range partitions {
		var err error
		if producers[i], err = senv.NewProducer(dedup.PartitionStream(super, i), stream.NewProducerOptions()); err != nil {
			t.Fatal(err)
		}
		confirms[i] = producers[i].NotifyPublishConfirmation()
	}
	return url, super, producers, confirms
}

// declarePartitions declares the partition streams of a super stream named
// after db (deleted at cleanup) and returns a connection to the stream port
// (closed at cleanup), its URL and the super stream's name.
func declarePartitions(t *testing.T, db *testenv.DB, partitions int) (*stream.Environment, string, string) {
	t.Helper()
	b := testenv.RabbitMQ(t)
	url, err := streams.FromAMQP(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	senv, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(url))
	if err != nil {
		t.Fatalf("connect to RabbitMQ's stream port (rabbitmq-plugins enable rabbitmq_stream): %v", err)
	}
	t.Cleanup(func() { _ = senv.Close() })
	super := "dedup-sc-" + db.Name
	for i := range partitions {
		name := dedup.PartitionStream(super, i)
		if err := senv.DeclareStream(name, &stream.StreamOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.DeleteStreamsAtCleanup(t, url, name)
	}
	return senv, url, super
}

// Three consumer processes share eight partition streams that the relay
// publishes into (in this process, from the outbox rows the test commits);
// one consumer is killed with SIGKILL while messages keep coming. Every message's effect commits
// exactly once (counted, not hidden by the unique key), in order per key,
// and the survivors take the dead one's partitions over from its last
// committed offsets.
func TestStreamConsumerKilledProcess(t *testing.T) {
	const (
		partitions = 8
		keys       = 48
		first      = 900  // published before the kill
		second     = 2100 // published around and after it
	)
	db := schemaDB(t)
	if _, err := db.SQL.Exec(streamEffectsTable); err != nil {
		t.Fatal(err)
	}
	_, url, super := declarePartitions(t, db, partitions)
	relayInto(t, db, url, super, partitions)
	var msgs []streamMsg // their ids are the rows' message ids (enqueue)
	next := map[string]int64{}
	for i := range first + second {
		key := fmt.Sprintf("key-%02d", i%keys)
		next[key]++
		msgs = append(msgs, streamMsg{key: key, seq: next[key]})
	}
	ctx := testenv.WorkContext(t)
	if err := enqueue(ctx, db, msgs[:first], 50); err != nil {
		t.Fatal(err)
	}

	consumer := "sc-" + db.Name
	env := []string{streamChildDSN + "=" + db.DSN, streamChildURL + "=" + url, streamChildStream + "=" + super,
		streamChildConsumer + "=" + consumer, streamChildParts + "=" + strconv.Itoa(partitions)}
	procs := map[string]*consumerProc{}
	for _, name := range []string{"proc-a", "proc-b", "proc-c"} {
		procs[name] = startConsumerProc(t, name, env)
	}
	effects := func() int64 { return int64(count(t, db.SQL, "SELECT COUNT(*) FROM stream_effects")) }

	// holders returns the instance holding each partition now: the offsets
	// row's owner where the partition's lock is held.
	holders := func() map[int]string {
		out := map[int]string{}
		for i := range partitions {
			name := dedup.PartitionStream(super, i)
			var owner sql.NullString
			if err := db.SQL.QueryRow("SELECT owner FROM stream_consumer_offsets WHERE consumer = ? AND stream = ? AND IS_USED_LOCK(?) IS NOT NULL",
				consumer, name, dedup.StreamLockName(consumer, name)).Scan(&owner); err != nil && !errors.Is(err, sql.ErrNoRows) {
				t.Fatal(err)
			}
			if owner.Valid {
				out[i] = owner.String
			}
		}
		return out
	}
	// Wait until the first batch is in and the three share the partitions.
	var held map[int]string
	if err := progress.Wait(ctx, "first batch consumed by three processes", func() int64 { return effects() + int64(len(held)) }, func() bool {
		held = holders()
		owners := map[string]int{}
		for _, o := range held {
			owners[o]++
		}
		return effects() >= first && len(held) == partitions && len(owners) == 3
	}); err != nil {
		t.Fatal(err)
	}

	// Publish the rest in the background while one process is killed.
	var published atomic.Int64
	pubErr := make(chan error, 1)
	go func() { // owned by the test: it waits on pubErr below
		for from := first; from < len(msgs); from += 150 {
			if err := enqueue(ctx, db, msgs[from:min(from+150, len(msgs))], 50); err != nil {
				pubErr <- err
				return
			}
			published.Store(int64(min(from+150, len(msgs))))
		}
		pubErr <- nil
	}()
	if err := progress.Wait(ctx, "effects of the second batch begin", effects, func() bool { return effects() >= first+300 }); err != nil {
		t.Fatal(err)
	}
	victim := ""
	atKillHolders := holders()
	for _, o := range atKillHolders {
		victim = o
		break
	}
	if victim == "" {
		t.Fatal("no process holds a partition")
	}
	atKill := effects()
	var victimStreams []any
	for i, o := range atKillHolders {
		if o == victim {
			victimStreams = append(victimStreams, dedup.PartitionStream(super, i))
		}
	}
	maxAtKill := count(t, db.SQL, "SELECT COALESCE(MAX(id), 0) FROM stream_effects")
	if err := procs[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-procs[victim].done
	t.Logf("killed %s (SIGKILL) at %d effects, %d of %d published", victim, atKill, published.Load(), len(msgs))
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}

	total := int64(len(msgs))
	if err := progress.Wait(ctx, "every effect", effects, func() bool { return effects() >= total }); err != nil {
		t.Fatal(err)
	}
	// Every effect exactly once: rows, distinct ids, no recorded double.
	if n, d := effects(), count(t, db.SQL, "SELECT COUNT(DISTINCT message_id) FROM stream_effects"); n != total || int64(d) != total {
		t.Fatalf("%d effects of %d distinct messages; want %d each", n, d, total)
	}
	if n := count(t, db.SQL, "SELECT COUNT(*) FROM stream_doubles"); n != 0 {
		t.Fatalf("%d messages ran their handler twice (refused by the unique key)", n)
	}
	if n := count(t, db.SQL, "SELECT COUNT(*) FROM outbox_failed"); n != 0 {
		t.Fatalf("%d messages went to outbox_failed", n)
	}
	// In order per key: the effects' commit order (id) follows seq.
	// Each effect is of a row the test committed, with that row's key and
	// seq as the relay carried them (x-partition-key, the seq header).
	byID := make(map[string]streamMsg, len(msgs))
	for _, m := range msgs {
		byID[m.id] = m
	}
	rows, err := db.SQL.Query("SELECT message_id, pkey, seq, instance FROM stream_effects ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	last := map[string]int64{}
	byInstance := map[string]int{}
	for rows.Next() {
		var key, instance string
		var raw []byte
		var seq int64
		if err := rows.Scan(&raw, &key, &seq, &instance); err != nil {
			t.Fatal(err)
		}
		id, err := uuid.FromBytes(raw)
		if err != nil {
			t.Fatal(err)
		}
		if m, ok := byID[id.String()]; !ok || m.key != key || m.seq != seq {
			t.Fatalf("effect of message %s (key %q, seq %d) is not of a committed row (%+v, %v)", id, key, seq, m, ok)
		}
		if seq != last[key]+1 {
			t.Fatalf("key %s: effect of seq %d after seq %d", key, seq, last[key])
		}
		last[key] = seq
		byInstance[instance]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The stored offsets are the ends of the streams; the survivors own
	// every partition.
	if n := count(t, db.SQL, "SELECT COALESCE(SUM(next_offset), 0) FROM stream_consumer_offsets WHERE consumer = ?", consumer); int64(n) != total {
		t.Errorf("stored offsets sum to %d, want %d", n, total)
	}
	// The kill was mid-stream: the survivors processed messages of the
	// partitions the victim held.
	if len(victimStreams) == 0 {
		t.Fatalf("%s held no partition when killed", victim)
	}
	in := strings.Repeat("?, ", len(victimStreams)-1) + "?"
	if n := count(t, db.SQL, "SELECT COUNT(*) FROM stream_effects WHERE id > ? AND instance <> ? AND stream IN ("+in+")",
		append([]any{maxAtKill, victim}, victimStreams...)...); n == 0 {
		t.Errorf("no effects on %s's partitions %v after its kill", victim, victimStreams)
	} else {
		t.Logf("%d effects on %s's partitions %v after its kill", n, victim, victimStreams)
	}
	final := holders()
	for i := range partitions {
		if o := final[i]; o == "" || o == victim {
			t.Errorf("partition %d held by %q after the kill of %s", i, o, victim)
		}
	}
	t.Logf("effects by process: %v", byInstance)
}

// A process that lost its partition's lock without noticing yet (its check
// is far off) and is in the middle of a message's transaction commits
// nothing: another process claimed the partition (a new epoch), and the
// old one's fenced offset write updates no row, so its transaction rolls
// back and it stops with ErrPartitionLost. Every effect once.
func TestStreamConsumerFencesLostPartition(t *testing.T) {
	const n = 20
	db := schemaDB(t)
	if _, err := db.SQL.Exec(streamEffectsTable); err != nil {
		t.Fatal(err)
	}
	url, super, producers, confirms := partitionStreams(t, db, 1)
	var msgs []streamMsg
	for i := range n {
		msgs = append(msgs, streamMsg{key: "k", seq: int64(i + 1), id: uuid.Must(uuid.NewV7()).String()})
	}
	ctx := testenv.WorkContext(t)
	if err := publishStreams(ctx, producers, confirms, msgs); err != nil {
		t.Fatal(err)
	}
	senv, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = senv.Close() })
	consumer := "sc-" + db.Name
	handler := func(instance string) map[string]dedup.StreamHandler {
		return map[string]dedup.StreamHandler{"test.event": func(ctx context.Context, tx *sql.Tx, m dedup.StreamMessage) error {
			id := uuid.MustParse(m.Delivery.MessageId)
			seq, _ := m.Delivery.Headers["seq"].(int64)
			_, err := tx.ExecContext(ctx, "INSERT INTO stream_effects (message_id, pkey, seq, instance, stream, off) VALUES (?, 'k', ?, ?, ?, ?)",
				id[:], seq, instance, m.Stream, m.Offset)
			return err
		}}
	}
	// a processes messages until the fifth, where it waits in the
	// transaction, before the offset write, for release.
	a := &dedup.StreamConsumer{Inbox: dedup.New(db.SQL, consumer), Stream: super, Partitions: 1,
		CheckInterval: time.Hour, Instance: "a", Handlers: handler("a")}
	waiting, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	dedup.SetBeforeOffset(a, func(m dedup.StreamMessage) {
		if m.Offset == 4 {
			close(waiting)
			<-release
		}
	})
	aCtx, aStop := context.WithCancel(ctx)
	aDone := make(chan error, 1)
	go func() { aDone <- a.Run(aCtx, senv) }() // owned by the test: aStop, then aDone
	defer func() { releaseOnce.Do(func() { close(release) }); aStop(); <-aDone }()
	step, cancel := progress.Step(ctx)
	defer cancel()
	select {
	case <-waiting:
	case <-step.Done():
		t.Fatal("a never reached its fifth message")
	}

	// a's lock connections (its partition's and its member slot's) die,
	// as when the network drops them; a does not check before its next
	// CheckInterval.
	for _, lock := range []string{dedup.StreamLockName(consumer, dedup.PartitionStream(super, 0)), dedup.StreamMemberLockName(consumer, super, 0)} {
		var connID int64
		if err := db.SQL.QueryRow("SELECT IS_USED_LOCK(?)", lock).Scan(&connID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.SQL.Exec(fmt.Sprintf("KILL CONNECTION %d", connID)); err != nil {
			t.Fatal(err)
		}
	}
	b := &dedup.StreamConsumer{Inbox: dedup.New(db.SQL, consumer), Stream: super, Partitions: 1,
		CheckInterval: 50 * time.Millisecond, Instance: "b", Handlers: handler("b")}
	bCtx, bStop := context.WithCancel(ctx)
	bDone := make(chan error, 1)
	go func() { bDone <- b.Run(bCtx, senv) }() // owned by the test: bStop, then bDone
	defer func() { bStop(); <-bDone }()
	effects := func() int64 { return int64(count(t, db.SQL, "SELECT COUNT(*) FROM stream_effects")) }
	if err := progress.Wait(ctx, "b processes the rest", effects, func() bool { return effects() >= n }); err != nil {
		t.Fatal(err)
	}
	releaseOnce.Do(func() { close(release) })
	if err := progress.Wait(ctx, "a sees its partition lost", nil, func() bool { return a.Stats().Losses > 0 }); err != nil {
		t.Fatal(err)
	}
	if got, d := effects(), count(t, db.SQL, "SELECT COUNT(DISTINCT message_id) FROM stream_effects"); got != n || d != n {
		t.Fatalf("%d effects of %d messages, want %d", got, d, n)
	}
	if got := count(t, db.SQL, "SELECT COUNT(*) FROM stream_effects WHERE instance = 'a'"); got != 4 {
		t.Errorf("a committed %d effects, want 4 (offsets 0-3)", got)
	}
	var epoch, next int64
	if err := db.SQL.QueryRow("SELECT epoch, next_offset FROM stream_consumer_offsets WHERE consumer = ?", consumer).Scan(&epoch, &next); err != nil {
		t.Fatal(err)
	}
	if epoch != 2 || next != n {
		t.Errorf("offsets row: epoch %d, next_offset %d; want 2, %d", epoch, next, n)
	}
	if s := a.Stats(); s.Processed != 4 {
		t.Errorf("a's stats %+v: want 4 processed", s)
	}
}

// With Deduplicate, a message that is in the stream twice (at two offsets,
// as after the relay's at-least-once cases) has its effect once; a type
// without a handler and a message whose handler keeps failing go to
// outbox_failed, and the offset moves past all of them.
func TestStreamConsumerDeduplicatesAndGivesUp(t *testing.T) {
	db := schemaDB(t)
	if _, err := db.SQL.Exec(streamEffectsTable); err != nil {
		t.Fatal(err)
	}
	url, super, producers, confirms := partitionStreams(t, db, 1)
	var msgs []streamMsg
	for i := range 20 {
		msgs = append(msgs, streamMsg{key: "k", seq: int64(i + 1), id: uuid.Must(uuid.NewV7()).String()})
	}
	poison := msgs[7].id
	msgs = append(msgs, msgs[3], msgs[10], streamMsg{key: "k", id: uuid.Must(uuid.NewV7()).String(), typ: "other"}, msgs[0])
	ctx := testenv.WorkContext(t)
	if err := publishStreams(ctx, producers, confirms, msgs); err != nil {
		t.Fatal(err)
	}
	senv, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = senv.Close() })
	consumer := "sc-" + db.Name
	c := &dedup.StreamConsumer{Inbox: dedup.New(db.SQL, consumer), Stream: super, Partitions: 1, Deduplicate: true,
		MaxAttempts: 2, RetryDelay: -1, CheckInterval: 50 * time.Millisecond,
		Handlers: map[string]dedup.StreamHandler{"test.event": func(ctx context.Context, tx *sql.Tx, m dedup.StreamMessage) error {
			if m.Delivery.MessageId == poison {
				return errors.New("poison")
			}
			id := uuid.MustParse(m.Delivery.MessageId)
			_, err := tx.ExecContext(ctx, "INSERT INTO stream_effects (message_id, pkey, seq, instance, stream, off) VALUES (?, 'k', 0, '', ?, ?)",
				id[:], m.Stream, m.Offset)
			return err
		}}}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, senv) }() // owned by the test: stop, then done
	stopped := false
	defer func() {
		if !stopped {
			stop()
			<-done
		}
	}()
	offset := func() int64 {
		var next int64
		_ = db.SQL.QueryRow("SELECT next_offset FROM stream_consumer_offsets WHERE consumer = ?", consumer).Scan(&next)
		return next
	}
	if err := progress.Wait(ctx, "the offset reaches the stream's end", offset, func() bool { return offset() == int64(len(msgs)) }); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db.SQL, "SELECT COUNT(*) FROM stream_effects"); n != 19 {
		t.Errorf("%d effects, want 19 (20 messages, one poison)", n)
	}
	if n := count(t, db.SQL, "SELECT COUNT(*) FROM outbox_failed WHERE source = 'inbox'"); n != 2 {
		t.Errorf("%d messages in outbox_failed, want 2 (the poison and the type without a handler)", n)
	}
	if s := c.Stats(); s.Processed != 19 || s.Duplicates != 3 || s.Failed != 2 || s.Retried != 1 {
		t.Errorf("stats %+v, want 19 processed, 3 duplicates, 2 failed, 1 retried", s)
	}
	// A clean stop: Run returns nil and the partition's lock is free.
	stop()
	stopped = true
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	var holder sql.NullInt64
	if err := db.SQL.QueryRow("SELECT IS_USED_LOCK(?)", dedup.StreamLockName(consumer, dedup.PartitionStream(super, 0))).Scan(&holder); err != nil || holder.Valid {
		t.Errorf("after Run returned the partition's lock is held by connection %v (%v)", holder, err)
	}
	if h := c.Held(); len(h) != 0 {
		t.Errorf("Held() = %v after Run returned", h)
	}
}
