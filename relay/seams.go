package relay

import (
	"context"
	"time"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/poller"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// The seams of the relay: what a leader term consumes, each as the few
// methods it calls. The production types are wired in New and Run
// (*publish.Channel, *checkpoint.Store, *leadership.Leader, canalBinlog
// and its *canal.Tailer, *publish.Publisher); the unit tests put in-memory
// fakes in their place.

// sink is one ordering lane's publisher, the changefeed-sink shape
// publish/doc.go describes. Publish emits m asynchronously: every message
// for which it returned nil later gets exactly one publish.Result through
// the callback the sink was opened with (unless the sink is closed first),
// in publish order per key only: a message nacked and retried holds back
// the Results of its own key, not those of the lane's other keys, so the
// callback must not rely on any order across keys (the tracker does not:
// a transaction is resolved once each of its rows has an outcome, in any
// order); messages of one non-empty key reach a queue in publish order.
// It blocks while the confirm window is full and returns ctx's error when
// ctx ends first. The relay never flushes or closes a lane's sink: it
// waits for the results through the tracker (ordering.Tracker.WaitIdle),
// and closing the publisher closes its sinks.
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
	// ClearFailed ends a FAILED status once epoch delivers again.
	ClearFailed(ctx context.Context, epoch int64) error
	// ClearStreamIDs sets the stored stream publishing ids to NULL
	// (a term whose ids do not continue them, before it publishes).
	ClearStreamIDs(ctx context.Context, epoch int64) error
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

// binlogServer is the binlog side of the server a binlog mode run reads
// (canalBinlog in production: the relay's pool and a *canal.Tailer per
// run).
type binlogServer interface {
	// Preflight reports what keeps the server from serving the binlog to
	// the relay (canal.Preflight): nil when it can.
	Preflight(ctx context.Context) error
	// CheckPosition returns a *canal.PurgedError when the server no longer
	// holds the binlog from from on.
	CheckPosition(ctx context.Context, from position.Position) error
	// SnapshotPosition is the server's position as of a consistent
	// snapshot (canal.SnapshotPosition): every transaction at or before it
	// is visible to every read that starts after it was taken.
	SnapshotPosition(ctx context.Context) (position.Position, error)
	// Open returns the source of one binlog mode run; it checks every
	// reconnected server for a lossy failover (failoverCheck) and reports
	// each reconnect attempt to onRetry. Its errors are *ConfigError.
	Open(onRetry func(err error, attempt int)) (source, error)
}

// brokerLink is what a stop asks of a mode's publisher
// (*publish.Publisher): whether it is connected to the broker, and a
// channel closed at the next change.
type brokerLink interface {
	Connected() (bool, <-chan struct{})
}

// pollPublisher is poll mode's publisher as the mode itself uses it: a
// stop watches its connection, and the mode closes it when it ends.
type pollPublisher interface {
	brokerLink
	Close() error
}

// rounds is poll mode's poller (*poller.Poller): RunUntil delivers in
// rounds until ctx ends (nil) or a fatal error. Once stop closes it starts
// no other round and returns when the rounds under way have committed. The
// end of ctx rolls back the rounds still under way: a *poller.CutError
// when they had published, saying how many rounds and messages.
type rounds interface {
	RunUntil(ctx context.Context, stop <-chan struct{}) error
}

// termPublisher is what Ready, BrokerNode and the broker watch ask of the
// current term's publisher (*publish.Publisher, or *streams.Publisher with
// the stream destination), in memory.
type termPublisher interface {
	// Node is the broker node it is connected to ("" when not).
	Node() string
	// ConfirmWait is how long it has waited for confirmations with
	// messages on the wire (0 when none are).
	ConfirmWait() time.Duration
}

// drainer is the sweep's poller (*poller.Poller) before binlog mode tails:
// DrainUntil delivers every pending row in rounds and returns how many.
// Once stop closes it lets the rounds under way commit and returns
// poller.ErrStopped unless every pending row was delivered; the end of ctx
// rolls back the rounds still under way (a *poller.CutError when they had
// published).
type drainer interface {
	DrainUntil(ctx context.Context, stop <-chan struct{}) (int, error)
}

// binlogPublisher is binlog mode's publisher for one run (binlogPub in
// production: a *publish.Publisher and pollers of the term on it).
type binlogPublisher interface {
	brokerLink
	// NewSink opens a lane's sink; onResult gets every result of it.
	NewSink(onResult func(publish.Result)) (sink, error)
	// Drainer returns the poller of the sweep before tailing.
	Drainer() (drainer, error)
	// DelayedSweeper returns the due-time sweep and its interval.
	DelayedSweeper() (delayedSweeper, time.Duration, error)
	// Close closes the publisher and its sinks.
	Close() error
}

// openBinlog opens binlog mode's publisher for leader's term, publishing
// under ctx (openBinlogPub in production).
type openBinlog func(ctx context.Context, leader lease) (binlogPublisher, error)

// delayedSweeper is binlog mode's due-time sweep (*poller.DelayedSweeper):
// Earliest returns the earliest available_at of the pending delayed rows
// (zero when there is none) and the server's UTC clock, Round delivers
// those that are due and returns how many.
type delayedSweeper interface {
	Earliest(ctx context.Context) (earliest, serverNow time.Time, err error)
	Round(ctx context.Context) (int, error)
	Close() error
}

// openPoll opens poll mode's publisher and poller for leader's term
// (openPolling in production).
type openPoll func(ctx context.Context, leader lease) (pollPublisher, rounds, error)

var (
	_ sink            = (*publish.Channel)(nil)
	_ progressStore   = (*checkpoint.Store)(nil)
	_ lease           = (*leadership.Leader)(nil)
	_ source          = (*canal.Tailer)(nil)
	_ binlogServer    = canalBinlog{}
	_ pollPublisher   = (*publish.Publisher)(nil)
	_ rounds          = (*poller.Poller)(nil)
	_ drainer         = (*poller.Poller)(nil)
	_ delayedSweeper  = (*poller.DelayedSweeper)(nil)
	_ binlogPublisher = binlogPub{}
	_ termPublisher   = (*publish.Publisher)(nil)
	_ termPublisher   = (*streams.Publisher)(nil)
)

// canalBinlog is the production binlogServer: the relay's pool for the
// positions, and a *canal.Tailer on the relay's canal.Config per run.
type canalBinlog struct{ r *Relay }

func (b canalBinlog) Preflight(ctx context.Context) error {
	return canal.Preflight(ctx, b.r.db, b.r.canal)
}

func (b canalBinlog) CheckPosition(ctx context.Context, from position.Position) error {
	return canal.CheckPosition(ctx, b.r.db, from)
}

func (b canalBinlog) SnapshotPosition(ctx context.Context) (position.Position, error) {
	return canal.SnapshotPosition(ctx, b.r.db)
}

func (b canalBinlog) Open(onRetry func(err error, attempt int)) (source, error) {
	cc := b.r.canal
	cc.CheckServer = func(ctx context.Context) error {
		if err := b.r.failover.checkReconnect(ctx); err != nil {
			return err
		}
		return b.r.checkStreamServer(ctx)
	}
	cc.CheckDumpServer = b.r.checkDumpServer
	cc.OnRetry = onRetry
	tailer, err := canal.New(cc)
	if err != nil {
		return nil, &ConfigError{err}
	}
	return tailer, nil
}

// binlogPub is the production binlogPublisher.
type binlogPub struct {
	*publish.Publisher
	r      *Relay
	leader lease
}

// openBinlogPub is binlog mode's openBinlog.
func (r *Relay) openBinlogPub(ctx context.Context, leader lease) (binlogPublisher, error) {
	pub, err := r.newPublisher(ctx)
	if err != nil {
		return nil, err
	}
	return binlogPub{Publisher: pub, r: r, leader: leader}, nil
}

func (b binlogPub) NewSink(onResult func(publish.Result)) (sink, error) {
	ch, err := b.NewChannel(onResult)
	if err != nil {
		return nil, err
	}
	return ch, nil
}

func (b binlogPub) Drainer() (drainer, error) {
	d, err := b.r.newPoller(poller.AMQP(b.Publisher), b.leader)
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (b binlogPub) DelayedSweeper() (delayedSweeper, time.Duration, error) {
	pl, err := b.r.newPoller(poller.AMQP(b.Publisher), b.leader)
	if err != nil {
		return nil, 0, err
	}
	s, err := pl.NewDelayedSweeper()
	if err != nil {
		return nil, 0, err
	}
	return s, pl.Config().Interval, nil
}
