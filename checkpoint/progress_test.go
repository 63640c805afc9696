package checkpoint_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/internal/mysqlconn"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// SetMode writes why the relay is in its mode to mode_reason; last_error
// keeps holding only errors.
func TestSetModeWritesModeReason(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	store, leader := leading(ctx, t, db)
	if err := store.RecordError(ctx, leader.Epoch(), "connection refused"); err != nil {
		t.Fatal(err)
	}
	if err := store.SetMode(ctx, leader.Epoch(), "poll", "binlog unavailable"); err != nil {
		t.Fatal(err)
	}
	p, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != "poll" || p.ModeReason != "binlog unavailable" || p.LastError != "connection refused" {
		t.Fatalf("mode %q, mode_reason %q, last_error %q; want poll, the reason, the error", p.Mode, p.ModeReason, p.LastError)
	}
}

// leaderDB is a migrated database and a pool on it that parses times, as the
// relay's does.
func leaderDB(ctx context.Context, t *testing.T) *sql.DB {
	t.Helper()
	return testenv.MySQL(t).Migrate(ctx, t).Pool(t, mysqlconn.UTC)
}

// leading is a Store of the default relay on db and the leader of its
// (first) term, released at cleanup.
func leading(ctx context.Context, t *testing.T, db *sql.DB) (*checkpoint.Store, *leadership.Leader) {
	t.Helper()
	store, err := checkpoint.New(db, checkpoint.Config{})
	if err != nil {
		t.Fatal(err)
	}
	el, err := leadership.New(db, leadership.Config{})
	if err != nil {
		t.Fatal(err)
	}
	leader, err := el.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { leader.Release(context.WithoutCancel(ctx)) })
	return store, leader
}
