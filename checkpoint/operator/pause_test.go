package operator_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// Pause and Resume flip the leader's Paused at once when woken, with a
// heartbeat a minute apart (so only the wake can explain it); MarkPaused
// shows in ReadStatus as stopped and is undone by Resume.
func TestLeaderSeesPauseWhenWoken(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	el, err := leadership.New(db, leadership.Config{HeartbeatInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.New(db, checkpoint.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Resume(ctx, db, "default"); !errors.Is(err, operator.ErrUnknownRelay) {
		t.Fatalf("Resume of a relay without a row: %v, want ErrUnknownRelay", err)
	}
	leader, err := el.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Release(context.WithoutCancel(ctx))
	paused, changed := leader.Paused()
	if paused {
		t.Fatal("a new leader of an ACTIVE relay is paused")
	}

	if was, err := operator.Pause(ctx, db, "default"); err != nil || was != checkpoint.StatusActive {
		t.Fatalf("Pause: %q, %v", was, err)
	}
	if woke, err := operator.Wake(ctx, db, "default"); err != nil || !woke {
		t.Fatalf("Wake: %v, %v", woke, err)
	}
	waitChanged(ctx, t, changed, "the pause")
	paused, changed = leader.Paused()
	if !paused {
		t.Fatal("Paused is false after the pause was seen")
	}
	s := readOne(ctx, t, db)
	if s.Status != checkpoint.StatusPaused || s.Paused == nil || s.Paused.Stopped || s.Paused.Since.IsZero() {
		t.Fatalf("status after Pause: %+v (%+v)", s, s.Paused)
	}
	if err := store.MarkPaused(ctx, leader.Epoch()); err != nil {
		t.Fatal(err)
	}
	if s := readOne(ctx, t, db); s.Paused == nil || !s.Paused.Stopped {
		t.Fatalf("status after MarkPaused: %+v", s.Paused)
	}
	// A second pause keeps the first one's time and the stopped leader.
	since := s.Paused.Since
	if was, err := operator.Pause(ctx, db, "default"); err != nil || was != checkpoint.StatusPaused {
		t.Fatalf("second Pause: %q, %v", was, err)
	}
	if s := readOne(ctx, t, db); !s.Paused.Since.Equal(since) || !s.Paused.Stopped {
		t.Fatalf("a second pause changed the pause: %+v, was since %v", s.Paused, since)
	}

	if was, err := operator.Resume(ctx, db, "default"); err != nil || was != checkpoint.StatusPaused {
		t.Fatalf("Resume: %q, %v", was, err)
	}
	if _, err := operator.Wake(ctx, db, "default"); err != nil {
		t.Fatal(err)
	}
	waitChanged(ctx, t, changed, "the resume")
	if paused, _ := leader.Paused(); paused {
		t.Fatal("Paused is true after the resume was seen")
	}
	if s := readOne(ctx, t, db); s.Status != checkpoint.StatusActive || s.Paused != nil {
		t.Fatalf("status after Resume: %+v", s)
	}
	// A leader that stopped earlier cannot mark a pause it has not seen.
	if err := store.MarkPaused(ctx, leader.Epoch()); err != nil {
		t.Fatal(err)
	}
	if s := readOne(ctx, t, db); s.Status != checkpoint.StatusActive {
		t.Fatalf("MarkPaused of an ACTIVE relay changed it: %+v", s)
	}
}

// Wakes that land on the heartbeat's own statements (KILL QUERY of the
// UPDATE or the SELECT, not only of the wait) never cost leadership.
func TestLeaderSurvivesWakeStorm(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	// Each wake makes the heartbeat beat at once, so the next wake of the
	// loop tends to land on the beat's own statements whatever the
	// interval; a short one would only add timeouts of a loaded machine
	// (the wait is bounded by twice the interval).
	el, err := leadership.New(db, leadership.Config{HeartbeatInterval: time.Second, LeaderLease: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	leader, err := el.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Release(context.WithoutCancel(ctx))
	// A millisecond apart: each wake tends to land on the beat the previous
	// one started, without the storm itself stalling a loaded server.
	for i := range 1000 {
		time.Sleep(time.Millisecond)
		if _, err := operator.Wake(ctx, db, "default"); err != nil {
			t.Fatalf("wake %d: %v", i, err)
		}
		if err := leader.Err(); err != nil {
			t.Fatalf("leadership lost after %d wakes: %v", i+1, err)
		}
	}
	// Past the lease: still leading, so the heartbeat still renews it.
	select {
	case <-leader.Lost():
		t.Fatalf("leadership lost after the wakes: %v", leader.Err())
	case <-time.After(6 * time.Second):
	}
	if !leader.Valid() {
		t.Fatal("leader not valid after the wakes")
	}
}

func waitChanged(ctx context.Context, t *testing.T, changed <-chan struct{}, what string) {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	// The bounded wait is the assertion: the heartbeat is a minute apart.
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatalf("the leader did not see %s within 5 s", what)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
}

func readOne(ctx context.Context, t *testing.T, db *sql.DB) operator.RelayStatus {
	t.Helper()
	list, err := operator.ReadStatus(ctx, db, "default", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return list[0]
}

// A wake sent the moment a leader is elected, before its lock connection
// has begun its wait, is not lost: the leader sees the pause at once, not
// at the next heartbeat a minute later.
func TestWakeRightAfterAcquireIsSeen(t *testing.T) {
	ctx := testenv.WorkContext(t)
	db := leaderDB(ctx, t)
	el, err := leadership.New(db, leadership.Config{HeartbeatInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		leader, err := el.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, changed := leader.Paused()
		if _, err := operator.Pause(ctx, db, "default"); err != nil {
			t.Fatal(err)
		}
		if _, err := operator.Wake(ctx, db, "default"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
		case <-time.After(5 * time.Second):
			t.Fatalf("term %d: the leader did not see the pause within 5 s (err %v)", i+1, leader.Err())
		}
		if _, err := operator.Resume(ctx, db, "default"); err != nil {
			t.Fatal(err)
		}
		if err := leader.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
