package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

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
			next, err := binlogEnd(zaptest.NewLogger(t), tc.shutdown, tc.fallback, tc.readErr, tc.ackErr, tc.leaseE)
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
