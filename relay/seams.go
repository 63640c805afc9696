package relay

import (
	"context"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/publish"
)

// The seams of the relay: what a leader term consumes, each as the few
// methods it calls. The production types are wired in New and Run
// (*publish.Channel, *checkpoint.Store, *leadership.Leader,
// *canal.Tailer); the unit tests put in-memory fakes in their place.

// sink is one ordering lane's publisher, the changefeed-sink shape
// publish/doc.go describes. Publish emits m asynchronously: every message
// for which it returned nil later gets exactly one publish.Result, in
// publish order, through the callback the sink was opened with (unless the
// sink is closed first); messages of one non-empty key reach a queue in
// publish order. It blocks while the confirm window is full and returns
// ctx's error when ctx ends first. The relay never flushes or closes a
// lane's sink: it waits for the results through the tracker
// (ordering.Tracker.WaitIdle), and closing the publisher closes its sinks.
type sink interface {
	Publish(ctx context.Context, m publish.Message) error
}

// progressStore is the progress row as a leader term uses it: all writes
// are fenced by the term's epoch and fail with checkpoint.ErrFenced once a
// newer leader exists.
type progressStore interface {
	// Load reads the stored checkpoint (position, mode, why).
	Load(ctx context.Context) (checkpoint.Progress, error)
	// Ack deletes or marks the acknowledged rows, records the failed ones
	// in outbox_failed and stores the position, in one transaction.
	Ack(ctx context.Context, epoch int64, a checkpoint.Ack) error
	// Pending reports which of ids are still pending in the outbox table.
	Pending(ctx context.Context, ids []uint64) (map[uint64]bool, error)
	// SetMode stores the mode of the term ("" or "poll") and why.
	SetMode(ctx context.Context, epoch int64, mode, reason string) error
	// MarkPaused records that epoch has stopped for an operator's pause.
	MarkPaused(ctx context.Context, epoch int64) error
}

// lease is one leader term's leadership.
type lease interface {
	// Epoch is the term's fencing token.
	Epoch() int64
	// Valid reports whether the lease is still held: false once it may have
	// expired (a standby may lead); then the term must publish nothing more.
	Valid() bool
	// Lost is closed when leadership is lost; Err then says why (nil before).
	Lost() <-chan struct{}
	Err() error
	// Lose ends the term with err (a fenced write showed a newer leader).
	Lose(err error)
	// Paused reports whether an operator has paused the relay, and a
	// channel closed at the next change.
	Paused() (bool, <-chan struct{})
}

// source is the binlog stream: Run calls h.Row for each outbox row and
// h.Commit at the end of every transaction, from position from, until ctx
// ends (it returns ctx's error) or an error a reconnect does not cure.
type source interface {
	Run(ctx context.Context, from position.Position, h canal.Handler) error
}

var (
	_ sink          = (*publish.Channel)(nil)
	_ progressStore = (*checkpoint.Store)(nil)
	_ lease         = (*leadership.Leader)(nil)
	_ source        = (*canal.Tailer)(nil)
)
