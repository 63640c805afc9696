package dedup_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/streams"
)

// relayInto runs the relay in this process until the test ends, publishing
// db's outbox rows into the partition streams super-0 … super-(partitions-1)
// at url: the consumers read what the relay wrote, in its format, not a copy
// of that format made by the test. The relay name is derived from db's name:
// a relay name's leadership lock is the server's, and the tests share one.
func relayInto(t *testing.T, db *testenv.DB, url, super string, partitions int) {
	t.Helper()
	sum := sha256.Sum256([]byte(db.Name))
	name := "dedup-" + hex.EncodeToString(sum[:8])
	b := testenv.RabbitMQ(t)
	r, err := relay.New(relay.Config{
		MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange,
		ServerID: testenv.ServerID(t), RelayName: name, CheckpointInterval: time.Second,
		Stream: streams.Config{Stream: super, Partitions: partitions, URL: url, Producer: name},
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Named("relay"),
	})
	if err != nil {
		t.Fatalf("new relay: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }() // owned by the cleanup below, which waits for it
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("relay: %v", err)
			}
		case <-time.After(progress.Patience):
			t.Errorf("relay still running %v after its shutdown began", progress.Patience)
		}
		r.Close()
	})
}

// enqueue writes msgs as outbox rows in order, chunk rows per transaction,
// as a producer would (outbox.Enqueue), and sets each one's id to the
// message id Enqueue gave its row. The row's headers carry seq; its
// partition key is key.
func enqueue(ctx context.Context, db *testenv.DB, msgs []streamMsg, chunk int) error {
	for from := 0; from < len(msgs); from += chunk {
		part := msgs[from:min(from+chunk, len(msgs))]
		rows := make([]outbox.Message, len(part))
		for i, m := range part {
			typ := m.typ
			if typ == "" {
				typ = "test.event"
			}
			rows[i] = outbox.Message{
				PartitionKey: m.key, RoutingKey: "rk", MessageType: typ, ContentType: "application/json",
				Headers: map[string]any{"seq": m.seq},
				Payload: []byte(fmt.Sprintf(`{"key":%q,"seq":%d}`, m.key, m.seq)),
			}
		}
		tx, err := db.SQL.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("begin the producer's transaction: %w", err)
		}
		ids, err := outbox.Enqueue(ctx, tx, rows...)
		if err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("enqueue rows %d-%d: %w", from, from+len(part)-1, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("commit rows %d-%d: %w", from, from+len(part)-1, err)
		}
		for i, id := range ids {
			part[i].id = id.String()
		}
	}
	return nil
}
