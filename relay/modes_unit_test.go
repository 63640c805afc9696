package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/canal"
)

// Unit tests of the mode switches and of pause, on fakes.

// How a binlog mode run ends decides what the term does next: a shutdown
// ends with the final acknowledgement's outcome, a fallback switches to
// poll mode once what was published is acknowledged, a lost leadership ends
// the term with the loss (not with a read error it may have caused), and
// any other read error ends it with that error.
func TestUnitBinlogEnd(t *testing.T) {
	readErr, ackErr, lost := errors.New("read"), errors.New("ack"), errors.New("lease lost")
	for _, tc := range []struct {
		name                    string
		shutdown                bool
		fallback                string
		readErr, ackErr, leaseE error
		wantTo                  Mode
		wantErr                 error
	}{
		{name: "shutdown", shutdown: true, readErr: readErr},
		{name: "shutdown, final ack fails", shutdown: true, ackErr: ackErr, wantErr: ackErr},
		{name: "fallback", fallback: "binlog unreadable", readErr: readErr, wantTo: ModePoll},
		{name: "fallback, ack fails", fallback: "binlog unreadable", readErr: readErr, ackErr: ackErr, wantErr: ackErr},
		{name: "leadership lost", readErr: readErr, leaseE: lost, wantErr: lost},
		{name: "read error", readErr: readErr, wantErr: readErr},
		{name: "clean end, ack fails", ackErr: ackErr, wantErr: ackErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var detour *modeSwitch
			if tc.fallback != "" {
				detour = &modeSwitch{to: ModePoll, reason: tc.fallback}
			}
			next, err := binlogEnd(zaptest.NewLogger(t), tc.shutdown, detour, tc.readErr, tc.ackErr, tc.leaseE)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if tc.fallback != "" && err != nil && errors.Is(err, readErr) {
				t.Fatalf("fallback ends with the read error %v: an auto relay must not exit for it", err)
			}
			switch {
			case tc.wantTo == "" && next != nil:
				t.Fatalf("switch to %s, want none", next.to)
			case tc.wantTo != "" && (next == nil || next.to != tc.wantTo || next.reason != tc.fallback):
				t.Fatalf("switch %+v, want to %s because %q", next, tc.wantTo, tc.fallback)
			}
		})
	}
}

// Only --mode auto falls back to polling, and only for what retrying the
// binlog cannot fix: a purged position, a missing grant, TLS, the server's
// settings. A diverged stream restarts the term instead.
func TestUnitFallbackReason(t *testing.T) {
	purged := fmt.Errorf("tail: %w", &canal.PurgedError{Detail: "purged"})
	for _, tc := range []struct {
		mode Mode
		err  error
		want bool
	}{
		{ModeAuto, purged, true},
		{ModeAuto, &canal.AccessError{User: "relay", Detail: "no REPLICATION SLAVE"}, true},
		{ModeAuto, &canal.PreflightError{Problem: "binlog_format is STATEMENT"}, true},
		{ModeAuto, &ConfigError{errors.New("bad")}, true},
		{ModeAuto, &canal.DivergedError{Expected: "0-1-5", Got: "0-2-5"}, false},
		{ModeAuto, errors.New("connection reset"), false},
		{ModeAuto, nil, false},
		{ModeBinlog, purged, false},
		{ModePoll, purged, false},
	} {
		r := unitRelay(t, newFakeStore(), func(c *Config) { c.Mode = tc.mode })
		got := r.fallbackReason(tc.err)
		if (got != "") != tc.want || tc.want && got != tc.err.Error() {
			t.Errorf("mode %s, %v: fallback reason %q, want fallback %v", tc.mode, tc.err, got, tc.want)
		}
	}
}

// startMode honours --mode poll and --mode binlog without asking the server.
func TestUnitStartModeFixed(t *testing.T) {
	for _, mode := range []Mode{ModeBinlog, ModePoll} {
		r := unitRelay(t, newFakeStore(), func(c *Config) { c.Mode = mode })
		got, reason := r.startMode(context.Background())
		if got != mode || !strings.Contains(reason, string(mode)) {
			t.Errorf("--mode %s: start in %s (%q)", mode, got, reason)
		}
	}
}

// A paused leader keeps leadership and does nothing else: it records the
// pause for its epoch, reports itself paused and ready, and returns when an
// operator resumes it; a leadership lost while paused ends the hold with
// the loss.
func TestUnitHoldPaused(t *testing.T) {
	store := newFakeStore()
	r := unitRelay(t, store, nil)
	lease := newFakeLease(9)
	lease.setPaused(true)
	done := make(chan error, 1)
	go func() { done <- r.holdPaused(context.Background(), lease) }()
	store.until(t, "the pause is recorded", func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.paused) == 1
	})
	if store.paused[0] != 9 {
		t.Fatalf("pause recorded for epoch %d, want 9", store.paused[0])
	}
	if !r.Paused() || r.Ready() != nil || r.Tailing() || r.Polling() {
		t.Fatalf("while paused: Paused %v, Ready %v, Tailing %v, Polling %v; want paused and ready only",
			r.Paused(), r.Ready(), r.Tailing(), r.Polling())
	}
	lease.setPaused(false)
	if err := <-done; err != nil {
		t.Fatalf("resume: %v", err)
	}
	if r.Paused() {
		t.Fatal("still paused after the resume")
	}

	lease.setPaused(true)
	go func() { done <- r.holdPaused(context.Background(), lease) }()
	store.until(t, "the second pause is recorded", func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.paused) == 2
	})
	lost := errors.New("lease lost")
	lease.Lose(lost)
	if err := <-done; !errors.Is(err, lost) {
		t.Fatalf("leadership lost while paused: %v, want %v", err, lost)
	}
}

// fakeModes scripts the modes of a term: each call of a mode takes the next
// step of its list.
type fakeModes struct {
	mu      sync.Mutex
	starts  int
	binlog  []func(ctx context.Context) (*modeSwitch, error)
	poll    []func(ctx context.Context) (*modeSwitch, error)
	entered []Mode // OnMode, in order
}

func (f *fakeModes) wire(r *Relay) {
	r.cfg.OnMode = func(mode Mode, reason string) {
		f.mu.Lock()
		f.entered = append(f.entered, mode)
		f.mu.Unlock()
	}
	r.modes = modeRunners{
		start: func(ctx context.Context) (Mode, string) {
			f.mu.Lock()
			f.starts++
			f.mu.Unlock()
			return ModeBinlog, "the server serves the binlog"
		},
		binlog: func(ctx context.Context, _ lease) (*modeSwitch, error) { return f.next(&f.binlog)(ctx) },
		poll:   func(ctx context.Context, _ lease) (*modeSwitch, error) { return f.next(&f.poll)(ctx) },
	}
}

func (f *fakeModes) next(steps *[]func(ctx context.Context) (*modeSwitch, error)) func(ctx context.Context) (*modeSwitch, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(*steps) == 0 {
		return func(context.Context) (*modeSwitch, error) {
			return nil, errors.New("mode run more often than scripted")
		}
	}
	step := (*steps)[0]
	*steps = (*steps)[1:]
	return step
}

func switchTo(m Mode, why string) func(context.Context) (*modeSwitch, error) {
	return func(context.Context) (*modeSwitch, error) { return &modeSwitch{to: m, reason: why}, nil }
}

func endTerm(context.Context) (*modeSwitch, error) { return nil, nil }

// A term switches binlog → poll → binlog as its modes ask, announcing each
// (Config.OnMode) and storing it: mode poll is stored at once (a restart
// after polling runs the handover), binlog as "". It ends when a mode ends
// without a switch, and with the error of a mode that fails.
func TestUnitModeSwitches(t *testing.T) {
	store := newFakeStore()
	r := unitRelay(t, store, nil)
	f := &fakeModes{
		binlog: []func(context.Context) (*modeSwitch, error){switchTo(ModePoll, "binlog purged"), endTerm},
		poll:   []func(context.Context) (*modeSwitch, error){switchTo(ModeBinlog, "the binlog is readable again")},
	}
	f.wire(r)
	if err := r.runModes(context.Background(), newFakeLease(3)); err != nil {
		t.Fatalf("term: %v", err)
	}
	if want := []Mode{ModeBinlog, ModePoll, ModeBinlog}; !slices.Equal(f.entered, want) {
		t.Fatalf("modes entered %v, want %v", f.entered, want)
	}
	if want := []string{"", "poll", ""}; !slices.Equal(store.modes, want) {
		t.Fatalf("modes stored %q, want %q", store.modes, want)
	}

	failed := errors.New("acknowledgement failed")
	f = &fakeModes{binlog: []func(context.Context) (*modeSwitch, error){
		func(context.Context) (*modeSwitch, error) { return nil, failed },
	}}
	f.wire(r)
	if err := r.runModes(context.Background(), newFakeLease(4)); !errors.Is(err, failed) {
		t.Fatalf("term with a failing mode: %v, want %v", err, failed)
	}
}

// An operator's pause stops the running mode as a shutdown does, holds
// leadership (the pause is recorded), and a resume picks the mode afresh
// (the checkpoint may have been moved meanwhile). A shutdown ends the term
// without a pause.
func TestUnitPauseAndResumeTerm(t *testing.T) {
	store := newFakeStore()
	r := unitRelay(t, store, nil)
	lease := newFakeLease(5)
	running := make(chan struct{})
	f := &fakeModes{binlog: []func(context.Context) (*modeSwitch, error){
		func(ctx context.Context) (*modeSwitch, error) {
			close(running)
			<-ctx.Done() // stopped by the pause
			return nil, nil
		},
		endTerm,
	}}
	f.wire(r)
	done := make(chan error, 1)
	go func() { done <- r.runModes(context.Background(), lease) }()
	<-running
	lease.setPaused(true)
	store.until(t, "the pause is recorded", func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.paused) == 1
	})
	lease.setPaused(false)
	if err := <-done; err != nil {
		t.Fatalf("term: %v", err)
	}
	if f.starts != 2 {
		t.Fatalf("mode picked %d times, want once at the start and once after the resume", f.starts)
	}

	ctx, cancel := context.WithCancel(context.Background())
	running = make(chan struct{})
	f = &fakeModes{binlog: []func(context.Context) (*modeSwitch, error){
		func(ctx context.Context) (*modeSwitch, error) {
			close(running)
			<-ctx.Done()
			return nil, nil
		},
	}}
	f.wire(r)
	go func() { done <- r.runModes(ctx, newFakeLease(6)) }()
	<-running
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if len(store.paused) != 1 {
		t.Fatalf("a shutdown recorded a pause (%v)", store.paused)
	}
}

// In --mode auto, binlog trouble that lasts Config.FallbackAfter (counted
// from the first failed attempt since the stream last progressed) while
// the database answers sends the relay to poll mode, once; trouble while
// the database is down too does not, nor any in --mode binlog.
func TestUnitTroubleFallback(t *testing.T) {
	const after = time.Minute
	cases := []struct {
		name   string
		mode   Mode
		dbDown bool
		want   bool
	}{
		{"auto, database answers", ModeAuto, false, true},
		{"auto, database down", ModeAuto, true, false},
		{"binlog", ModeBinlog, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := unitRelay(t, newFakeStore(), func(c *Config) { c.Mode, c.FallbackAfter = tc.mode, after })
			var reasons []string
			w := &troubleWatch{r: r, stop: func(reason string) { reasons = append(reasons, reason) },
				ping: func(context.Context) error {
					if tc.dbDown {
						return errors.New("connection refused")
					}
					return nil
				}}
			streamErr := errors.New("binlog connection reset")
			w.onRetry(streamErr, 1)
			w.onRetry(streamErr, 2)
			if len(reasons) != 0 {
				t.Fatalf("fell back at once: %q", reasons)
			}
			// The trouble began longer ago than FallbackAfter (the clock
			// is the watch's own field: no waiting).
			w.mu.Lock()
			w.since = time.Now().Add(-after - time.Second)
			w.mu.Unlock()
			w.onRetry(streamErr, 3)
			w.onRetry(streamErr, 4)
			if got := len(reasons) == 1; got != tc.want || len(reasons) > 1 {
				t.Fatalf("fallbacks %q, want one: %v", reasons, tc.want)
			}
			if tc.want && !strings.Contains(reasons[0], streamErr.Error()) {
				t.Fatalf("reason %q does not name the stream's error", reasons[0])
			}
			// Progress (attempt 1 again) starts the clock over.
			w2 := &troubleWatch{r: r, stop: func(string) { t.Fatal("fell back after progress") }, ping: func(context.Context) error { return nil }}
			w2.onRetry(streamErr, 1)
			w2.mu.Lock()
			w2.since = time.Now().Add(-after - time.Second)
			w2.mu.Unlock()
			w2.onRetry(streamErr, 1)
		})
	}
}
