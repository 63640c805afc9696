package replay

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/publish"
)

// stream is the canal.Handler of a replay: it filters the rows, publishes
// them (or counts them, dry) and stops the tailer at the end of the range.
// Row and Commit run on the tailer's goroutine; the results and the
// progress fields are shared with the channels' goroutines and the progress
// reporter under mu.
type stream struct {
	cfg     *Config
	b       bounds
	epoch   int64
	log     *zap.Logger
	limit   *limiter
	lanes   *ordering.Lanes
	chans   []*publish.Channel // nil on a dry run
	started time.Time

	// Tailer goroutine only.
	seen       *position.GTIDs // GTID positions: every transaction the stream has passed
	prev       position.Position
	txnMsgs    int    // messages of the transaction being read
	firstPrev  string // positions around the first and the last transaction with messages
	firstCur   string
	lastPrev   string
	lastCur    string
	routes     map[routeKey]int
	loggedFail int

	mu  sync.Mutex
	s   Summary // counts; Routes and the GTIDs are filled in at the end
	pos position.Position
}

// errDone ends the stream once the range's end is reached.
var errDone = errors.New("replay: end of the range reached")

// failureTag is a published message's Tag: what a failure report names.
type failureTag struct {
	messageID string
	outboxID  uint64
}

func newStream(cfg *Config, b bounds, epoch int64) (*stream, error) {
	st := &stream{
		cfg: cfg, b: b, epoch: epoch, log: cfg.Logger,
		limit: newLimiter(cfg.Rate), lanes: ordering.NewLanes(cfg.Lanes),
		prev: b.from, pos: b.from, routes: map[routeKey]int{},
	}
	st.s.DryRun = cfg.DryRun
	if b.from.GTIDSet != "" || b.from.File == "" {
		seen, err := position.NewGTIDs(b.flavor, b.from.GTIDSet)
		if err != nil {
			return nil, refused("replay: start position %s: %v", b.from, err)
		}
		st.seen = seen
	}
	return st, nil
}

// Row is canal.Handler.Row.
func (st *stream) Row(ctx context.Context, rec *outbox.Record) error {
	if !st.cfg.Filter.match(rec) {
		st.count(func(s *Summary) { s.Filtered++ })
		return nil
	}
	if !rec.Due(time.Now()) {
		st.count(func(s *Summary) { s.NotDue++ })
		return nil
	}
	msg, err := publish.FromRecord(rec, st.cfg.DefaultExchange, st.epoch, true)
	if err != nil {
		return st.invalid(rec, err)
	}
	if st.cfg.Exchange != "" {
		msg.Exchange = st.cfg.Exchange
	}
	msg.Tag = failureTag{messageID: msg.Publishing.MessageId, outboxID: rec.ID}
	if st.chans != nil {
		if err := st.limit.wait(ctx); err != nil {
			return err
		}
		err := st.chans[st.lanes.For(rec.PartitionKey)].Publish(ctx, msg)
		if err != nil {
			return st.invalid(rec, err)
		}
	}
	st.txnMsgs++
	k := routeKey{msg.Exchange, msg.RoutingKey}
	other := 0
	if _, ok := st.routes[k]; ok || len(st.routes) < maxRoutes {
		st.routes[k]++
	} else {
		other = 1
	}
	st.count(func(s *Summary) { s.Messages++; s.OtherRoutes += other })
	return nil
}

// invalid records a row that cannot be published as it is.
func (st *stream) invalid(rec *outbox.Record, err error) error {
	var bad *publish.BadRecordError
	if !errors.As(err, &bad) {
		return err
	}
	st.fail(Failure{MessageID: rec.MessageID.String(), OutboxID: rec.ID, Outcome: "invalid", Reason: bad.Reason})
	return nil
}

// fail records a message without a confirm; any goroutine.
func (st *stream) fail(f Failure) {
	st.mu.Lock()
	defer st.mu.Unlock()
	switch f.Outcome {
	case "invalid":
		st.s.Invalid++
	case "returned":
		st.s.Returned++
	case "rejected":
		st.s.Rejected++
	}
	if len(st.s.Failures) < maxFailuresListed {
		st.s.Failures = append(st.s.Failures, f)
		msg := "replayed message not confirmed"
		if f.Outcome == "invalid" {
			msg = "outbox row cannot be published as it is"
		}
		st.log.Warn(msg, zap.String("message_id", f.MessageID),
			zap.Uint64("outbox_id", f.OutboxID), zap.String("outcome", f.Outcome), zap.String("reason", f.Reason))
	}
}

// onResult is every channel's result callback.
func (st *stream) onResult(r publish.Result) {
	if r.Outcome == publish.Confirmed {
		st.count(func(s *Summary) { s.Confirmed++ })
		return
	}
	tag, _ := r.Tag.(failureTag)
	st.fail(Failure{MessageID: tag.messageID, OutboxID: tag.outboxID, Outcome: r.Outcome.String(), Reason: r.Reason})
}

func (st *stream) count(f func(*Summary)) {
	st.mu.Lock()
	f(&st.s)
	st.mu.Unlock()
}

// Commit is canal.Handler.Commit: it notes the transaction and ends the
// stream once the range's end is passed.
func (st *stream) Commit(_ context.Context, pos position.Position, _ int) error {
	if st.txnMsgs > 0 {
		if st.firstCur == "" {
			st.firstPrev, st.firstCur = st.prev.GTIDSet, pos.GTIDSet
		}
		st.lastPrev, st.lastCur = st.prev.GTIDSet, pos.GTIDSet
		st.count(func(s *Summary) { s.Transactions++ })
		st.txnMsgs = 0
	}
	st.prev = pos
	st.mu.Lock()
	st.pos = pos
	st.mu.Unlock()
	done, err := st.passed(pos)
	if err != nil {
		return err
	}
	if done {
		return errDone
	}
	return nil
}

// passed reports whether the stream at pos has read the whole range (or
// reached the server's position at the start, which bounds every range).
func (st *stream) passed(pos position.Position) (bool, error) {
	if st.seen == nil || pos.GTIDSet == "" {
		for _, end := range []position.Position{st.b.to, st.b.limit} {
			if ok, err := reached(pos, end); err != nil || ok {
				return ok, err
			}
		}
		return false, nil
	}
	if err := st.seen.Passed(pos); err != nil {
		return false, err
	}
	for _, end := range []position.Position{st.b.to, st.b.limit} {
		if end.GTIDSet == "" {
			continue
		}
		if ok, err := st.seen.Covers(end); err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// progress is the state now.
func (st *stream) progress(prevMessages int, since time.Duration, final bool) Progress {
	st.mu.Lock()
	p := Progress{Messages: st.s.Messages, Confirmed: st.s.Confirmed, Position: st.pos, Final: final}
	st.mu.Unlock()
	p.Elapsed = time.Since(st.started)
	if since > 0 {
		p.Rate = float64(p.Messages-prevMessages) / since.Seconds()
	} else {
		p.Rate = float64(p.Messages) / max(p.Elapsed.Seconds(), 1e-9)
	}
	p.Done = fraction(st.b.flavor, st.b.from, st.end(), p.Position)
	if final {
		p.Done = 1
	}
	p.ETA = eta(p.Elapsed, p.Done)
	return p
}

// end is the range's effective end for progress: to, unless the server's
// start position comes first.
func (st *stream) end() position.Position {
	if ok, err := reached(st.b.limit, st.b.to); err == nil && ok {
		return st.b.to
	}
	return st.b.limit
}

// report calls OnProgress every ProgressInterval until stop is closed.
func (st *stream) report(stop <-chan struct{}) {
	if st.cfg.OnProgress == nil {
		return
	}
	t := time.NewTicker(st.cfg.ProgressInterval)
	defer t.Stop()
	last, lastAt := 0, time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			p := st.progress(last, now.Sub(lastAt), false)
			last, lastAt = p.Messages, now
			st.cfg.OnProgress(p)
		}
	}
}
