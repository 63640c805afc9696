package relay

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/poller"
)

// Unit tests on fakes of how a stop (a shutdown or a pause) cuts the work
// under way: binlog mode's transaction being read (stopReading), poll
// mode's rounds (stopRounds), and poll mode's term (runPoll).

// observeLogs sends r's log to an observer.
func observeLogs(r *Relay) *observer.ObservedLogs {
	core, logs := observer.New(zap.InfoLevel)
	r.log = zap.New(core)
	return logs
}

// warned fails unless the log has exactly one WARN, containing snippet,
// whose field messages is messages; with snippet "" it fails on any WARN.
func warned(t *testing.T, logs *observer.ObservedLogs, snippet string, messages int64) {
	t.Helper()
	warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
	if snippet == "" {
		if len(warns) > 0 {
			t.Fatalf("logged %q at WARN, want no warning", warns[0].Message)
		}
		return
	}
	if len(warns) != 1 || !strings.Contains(warns[0].Message, snippet) {
		t.Fatalf("logged %d warnings (%v), want one saying %q", len(warns), warns, snippet)
	}
	if got := warns[0].ContextMap()["messages"]; got != messages {
		t.Fatalf("the warning counts %v messages to be published again, want %d", got, messages)
	}
}

// within receives from ch, failing the test after a minute: far above
// what a busy machine takes, so only a hang fails.
func within[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("timed out waiting until %s", what)
		panic("unreachable")
	}
}

// A stop in the middle of a transaction waits for its end, but not past
// Config.ShutdownTimeout, and not at all once the broker is unreachable
// (nothing under way can be confirmed): then reading stops at once, and
// the cut is logged at WARN with how many messages of the transaction will
// be published again.
func TestUnitStopReadingCuts(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		timeout               time.Duration
		downBefore, downAfter bool
		want                  string
	}{
		{name: "the transaction outlasts ShutdownTimeout", timeout: 20 * time.Millisecond,
			want: "did not end within Config.ShutdownTimeout"},
		{name: "the broker is down", timeout: time.Hour, downBefore: true, want: "the AMQP broker is unreachable"},
		{name: "the broker goes down while waiting", timeout: time.Hour, downAfter: true, want: "the AMQP broker is unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := startUnitPipeline(t, func(c *Config) { c.ShutdownTimeout = tc.timeout })
			logs := observeLogs(u.p.r)
			src := midTxnSource() // never released: the transaction does not end
			rd := u.startRead(t, src, filePos(50))
			<-src.reached
			if tc.downBefore {
				u.pub.setDown(true)
			}
			rd.stopTerm()
			if tc.downAfter {
				<-u.p.stop // the stop has begun, and waits
				u.pub.setDown(true)
			}
			if err := within(t, "reading stops", rd.readDone); err != nil {
				t.Fatalf("read: %v", err)
			}
			warned(t, logs, tc.want, 1) // row 2 of the transaction under way
			u.waitPublished(t, 2)
			u.g.Signal("lane")
			if err := u.g.Wait("lane"); err != nil {
				t.Fatalf("lanes: %v", err)
			}
			if got := u.publishedIDs(); !slices.Equal(got, []uint64{1, 2}) {
				t.Fatalf("published %v, want 1 and 2 (read before the cut)", got)
			}
		})
	}
}

// Poll mode's stop (a shutdown, a pause, the handover to binlog mode) lets
// the rounds under way commit; on a shutdown or a pause it waits at most
// Config.ShutdownTimeout for them, and not at all while the broker is
// unreachable: then it cuts them (they roll back) and logs at WARN how many
// messages will be published again. It returns the poller's error, nil
// after a cut.
func TestUnitStopRoundsCut(t *testing.T) {
	dbErr := errors.New("database gone")
	cut := &poller.CutError{Messages: 3, Rounds: 1}
	for _, tc := range []struct {
		name                   string
		shutdown               bool
		timeout                time.Duration
		downBefore, downOnStop bool
		commits                bool  // the rounds commit once stop closes
		roundsErr              error // what they then return
		cutErr                 *poller.CutError
		wantCut                bool
		wantLog                string
		wantErr                error
	}{
		{name: "handover, the rounds commit", commits: true, timeout: time.Hour},
		{name: "handover, the poller fails", commits: true, roundsErr: dbErr, timeout: time.Hour, wantErr: dbErr},
		{name: "handover, the broker is down", commits: true, downBefore: true, timeout: time.Hour},
		{name: "shutdown, the rounds commit in time", shutdown: true, commits: true, timeout: time.Hour},
		{name: "shutdown, the rounds outlast ShutdownTimeout", shutdown: true, timeout: 20 * time.Millisecond,
			cutErr: cut, wantCut: true, wantLog: "did not finish within Config.ShutdownTimeout"},
		{name: "shutdown, the broker is down", shutdown: true, downBefore: true, timeout: time.Hour,
			cutErr: cut, wantCut: true, wantLog: "the AMQP broker is unreachable"},
		{name: "shutdown, the broker goes down while waiting", shutdown: true, downOnStop: true, timeout: time.Hour,
			cutErr: cut, wantCut: true, wantLog: "the AMQP broker is unreachable"},
		{name: "shutdown, the broker is down and no round is under way", shutdown: true, downBefore: true, timeout: time.Hour,
			cutErr: &poller.CutError{}, wantCut: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := unitRelay(t, newFakeStore(), func(c *Config) { c.ShutdownTimeout = tc.timeout })
			logs := observeLogs(r)
			broker := newFakeBroker()
			if tc.downBefore {
				broker.setDown(true)
			}
			pollCtx, cancelPoll := context.WithCancel(context.Background())
			defer cancelPoll()
			var cancelled atomic.Bool
			stop, done := make(chan struct{}), make(chan error, 1)
			go func() { // the poller's RunUntil
				<-stop
				if tc.downOnStop {
					broker.setDown(true)
				}
				if tc.commits {
					done <- tc.roundsErr
					return
				}
				<-pollCtx.Done() // rolls the rounds back
				done <- tc.cutErr
			}()
			ctx, stopTerm := context.WithCancel(context.Background())
			defer stopTerm()
			if tc.shutdown {
				stopTerm()
			}
			stopped := make(chan error, 1)
			go func() {
				stopped <- r.stopRounds(ctx, broker, stop, done, func() { cancelled.Store(true); cancelPoll() })
			}()
			err := within(t, "the rounds stop", stopped)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("stopRounds: %v, want %v", err, tc.wantErr)
			}
			if cancelled.Load() != tc.wantCut {
				t.Fatalf("rounds cut: %v, want %v", cancelled.Load(), tc.wantCut)
			}
			warned(t, logs, tc.wantLog, 3)
		})
	}
}

// fakePollPub is poll mode's publisher: its connection, and whether the
// mode closed it.
type fakePollPub struct {
	*fakeBroker
	closed atomic.Bool
}

func (p *fakePollPub) Close() error { p.closed.Store(true); return nil }

// fakeRounds is a poller whose rounds commit at once when stopped; started
// closes when RunUntil runs.
type fakeRounds struct {
	once    sync.Once
	started chan struct{}
}

func (f *fakeRounds) RunUntil(ctx context.Context, stop <-chan struct{}) error {
	f.once.Do(func() { close(f.started) })
	select {
	case <-stop:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unitPollTerm runs runPoll on fakes in a goroutine; it returns the
// publisher, the poller, and what runPoll returns, once it is polling.
func unitPollTerm(t *testing.T, r *Relay, ctx context.Context, leader lease) (*fakePollPub, chan *modeSwitch, chan error) {
	t.Helper()
	pub, rr := &fakePollPub{fakeBroker: newFakeBroker()}, &fakeRounds{started: make(chan struct{})}
	r.openPoll = func(context.Context, lease) (pollPublisher, rounds, error) { return pub, rr, nil }
	next, errs := make(chan *modeSwitch, 1), make(chan error, 1)
	go func() {
		n, err := r.runPoll(ctx, leader)
		next <- n
		errs <- err
	}()
	select {
	case <-rr.started:
	case err := <-errs:
		t.Fatalf("poll mode ended before polling: %v", err)
	}
	if !r.Polling() {
		t.Fatal("polling, but Polling is false")
	}
	return pub, next, errs
}

// A poll term ends on a shutdown (after its rounds commit), with the loss
// when leadership is lost, and in --mode auto with a switch to binlog mode
// once the binlog is readable again; every time it closes its publisher and
// stops reporting itself polling.
func TestUnitPollTerm(t *testing.T) {
	t.Run("shutdown", func(t *testing.T) {
		r := unitRelay(t, newFakeStore(), func(c *Config) { c.Mode = ModePoll })
		ctx, stopTerm := context.WithCancel(context.Background())
		pub, next, errs := unitPollTerm(t, r, ctx, newFakeLease(1))
		stopTerm()
		if n, err := <-next, <-errs; n != nil || err != nil {
			t.Fatalf("shutdown: switch %+v, error %v; want neither", n, err)
		}
		if !pub.closed.Load() || r.Polling() {
			t.Fatalf("after the term: publisher closed %v, polling %v", pub.closed.Load(), r.Polling())
		}
	})
	t.Run("leadership lost", func(t *testing.T) {
		r := unitRelay(t, newFakeStore(), func(c *Config) { c.Mode = ModePoll })
		leader := newFakeLease(2)
		pub, next, errs := unitPollTerm(t, r, context.Background(), leader)
		lost := errors.New("lease lost")
		leader.Lose(lost)
		if n, err := <-next, <-errs; n != nil || !errors.Is(err, lost) {
			t.Fatalf("leadership lost: switch %+v, error %v; want the loss", n, err)
		}
		if !pub.closed.Load() || r.Polling() {
			t.Fatalf("after the term: publisher closed %v, polling %v", pub.closed.Load(), r.Polling())
		}
	})
	t.Run("auto, the binlog comes back", func(t *testing.T) {
		r := unitRelay(t, newFakeStore(), func(c *Config) { c.Mode, c.BinlogRetryInterval = ModeAuto, time.Millisecond })
		var probes atomic.Int32
		r.binlog = fakeBinlog{preflight: func() error {
			if probes.Add(1) < 3 {
				return errors.New("binlog_format is STATEMENT")
			}
			return nil
		}}
		pub, next, errs := unitPollTerm(t, r, context.Background(), newFakeLease(3))
		n, err := <-next, <-errs
		if err != nil || n == nil || n.to != ModeBinlog {
			t.Fatalf("switch %+v, error %v; want a switch to binlog mode", n, err)
		}
		if probes.Load() != 3 {
			t.Fatalf("probed %d times, want 3 (two failures, then readable)", probes.Load())
		}
		if !pub.closed.Load() || r.Polling() {
			t.Fatalf("after the term: publisher closed %v, polling %v", pub.closed.Load(), r.Polling())
		}
	})
}
