package relay

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
)

// sweepDelayed is the due-time sweep of binlog mode (docs/operations.md,
// "Delayed messages"). It sleeps until the earliest pending delayed row is
// due, delivers what is due, looks for the next earliest, and sleeps again:
// while no delayed row is due it sends no statement. It learns the earliest
// from one statement once the stream's start is fixed (Earliest, which
// also reads the server's clock) and from the stream, which hands it the
// available_at of every delayed row it reads (dueHint), so a row due sooner
// than the one it sleeps for wakes it. It stops between rounds when stop
// closes; errors are logged and retried after the poll interval, except a
// fenced round or an expired lease, which end the leader term at once.
func (p *pipeline) sweepDelayed(ctx context.Context, stop <-chan struct{}) {
	s, interval, err := p.pub.DelayedSweeper()
	if err == nil {
		defer p.r.closeLogged("the due-time sweep's publisher", s)
		p.runSweeper(ctx, stop, s, interval)
		return
	}
	p.r.log.Error("due-time sweep not started; delayed rows wait for the next handover", zap.Error(err))
}

// runSweeper is sweepDelayed's loop on s. It waits for the stream's start
// to be fixed (p.positioned) before its first look: every delayed row
// committed after that look is one the stream reads, so none is missed.
func (p *pipeline) runSweeper(ctx context.Context, stop <-chan struct{}, s delayedSweeper, interval time.Duration) {
	log := p.r.log.Named("delayed")
	select {
	case <-p.positioned:
	case <-stop:
		return
	case <-ctx.Done():
		return
	}
	hint := &p.r.backlog.sweeping // delayed rows are a backlog the binlog does not show
	defer hint.Store(false)
	sched := dueSchedule{interval: interval}
	sched.look(ctx, s, log)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		hint.Store(sched.known())
		var wake <-chan time.Time
		if d, ok := sched.wait(); ok {
			timer.Reset(d)
			wake = timer.C
		}
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-p.due.wake:
			sched.learn(p.due.take())
			continue
		case <-wake:
		}
		n, err := s.Round(ctx)
		sched.lastRound = time.Now()
		if err != nil {
			if errors.Is(err, checkpoint.ErrFenced) {
				p.leader.Lose(err) // a newer leader exists: end the term now
				return
			}
			if errors.Is(err, leadership.ErrLeaseExpired) || ctx.Err() != nil {
				return // Valid has ended the term, or the run ends
			}
			log.Warn("due-time sweep round failed; retrying after the poll interval", zap.Error(err))
			continue // sched.next is still due: the next round comes after the interval
		}
		if n > 0 {
			log.Debug("delivered due delayed rows", zap.Int("rows", n))
		}
		sched.look(ctx, s, log)
	}
}

// wakeMargin is how long after the earliest due time the sweep wakes: the
// server's clock, not the relay's, decides what is due, and what the relay
// knows of it is as old as its last look (dueSchedule).
const wakeMargin = time.Millisecond

// dueSchedule is what the due-time sweep knows of the next due time.
type dueSchedule struct {
	interval  time.Duration // --poll-interval: rounds come at most this often
	next      time.Time     // the earliest known available_at, on the server's clock; zero: none known
	clock     serverClock
	lastRound time.Time // the end of the last round; zero before the first
}

// known reports whether a delayed row is known to be pending.
func (d *dueSchedule) known() bool { return !d.next.IsZero() }

// learn takes the available_at of a delayed row the stream read.
func (d *dueSchedule) learn(at time.Time) {
	if !at.IsZero() && (d.next.IsZero() || at.Before(d.next)) {
		d.next = at
	}
}

// wait returns how long to sleep until the next round: until the earliest
// known row is due on the server's clock, and at least --poll-interval after
// the last round. ok is false when no delayed row is known: then only the
// stream can wake the sweep.
func (d *dueSchedule) wait() (sleep time.Duration, ok bool) {
	if d.next.IsZero() {
		return 0, false
	}
	sleep = d.clock.until(d.next) + wakeMargin
	if !d.lastRound.IsZero() {
		sleep = max(sleep, d.interval-time.Since(d.lastRound))
	}
	return max(sleep, 0), true
}

// look asks the table for the earliest pending delayed row and the
// server's clock (one statement), replacing what it knew: the table holds
// every row the stream had handed over. When the look fails it sweeps
// after the poll interval, to be safe.
func (d *dueSchedule) look(ctx context.Context, s delayedSweeper, log *zap.Logger) {
	earliest, serverNow, err := s.Earliest(ctx)
	after := time.Now()
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("looking for the earliest delayed row failed; sweeping after the poll interval to be safe", zap.Error(err))
		}
		if d.clock.at.IsZero() {
			d.clock = serverClock{at: after, server: after.UTC()} // the relay's own clock until a look works
		}
		d.next = d.clock.now()
		d.lastRound = after
		return
	}
	// The server read its clock before the answer arrived: taking the
	// arrival as that moment, the relay never reckons the server's clock
	// ahead of what it is. A wait may end late by the answer's way back (a
	// busy machine's scheduling delays included), never early, so a wake
	// never finds nothing due.
	d.clock = serverClock{at: after, server: serverNow}
	d.next = earliest
}

// serverClock is the database server's UTC clock as the relay reckons it:
// server was the server's time at at, a local reading that carries the
// monotonic clock, so a step of the relay's wall clock changes nothing and
// the skew between the two clocks is no error.
type serverClock struct {
	at     time.Time
	server time.Time
}

// now is the server's time now.
func (c serverClock) now() time.Time { return c.server.Add(time.Since(c.at)) }

// until is how long until t on the server's clock.
func (c serverClock) until(t time.Time) time.Duration { return t.Sub(c.now()) }

// dueHint hands the due-time sweep the available_at of the delayed rows the
// stream reads: the earliest since the sweep last took it. The stream never
// waits for the sweep.
type dueHint struct {
	mu       sync.Mutex
	earliest time.Time     // zero: none since the last take
	wake     chan struct{} // holds a signal while earliest may be set
}

func newDueHint() *dueHint { return &dueHint{wake: make(chan struct{}, 1)} }

// offer notes a delayed row's available_at and wakes the sweep when it is
// the earliest since the sweep last took one.
func (h *dueHint) offer(at time.Time) {
	h.mu.Lock()
	sooner := h.earliest.IsZero() || at.Before(h.earliest)
	if sooner {
		h.earliest = at
	}
	h.mu.Unlock()
	if sooner {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
}

// take returns the earliest available_at offered since the last take (zero
// when none) and forgets it.
func (h *dueHint) take() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	at := h.earliest
	h.earliest = time.Time{}
	return at
}
