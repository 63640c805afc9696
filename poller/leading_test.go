package poller_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/poller"
)

// A poller whose Leading says no (a leader stopped past its lease): its
// round claims rows, asks Leading with them claimed, publishes none and
// rolls back: the rows stay pending and lockable, and Run returns an error
// wrapping leadership.ErrLeaseExpired by itself. Drain ends the same way.
// A poller that leads then delivers every row exactly once, which also
// shows that nothing was published before.
func TestNotLeadingPublishesNothing(t *testing.T) {
	const rows = 60
	e := setup(t, checkpoint.Delete)
	v := consume(t, e.broker)
	ctx := testenv.WorkContext(t)
	produce(ctx, t, e, v, load{producers: 2, partitions: 6, total: rows})

	// lockable counts the rows another transaction can lock now: those
	// not claimed by a round.
	lockable := func() int {
		tx, err := e.pool.BeginTx(ctx, nil)
		if err != nil {
			t.Error(err)
			return -1
		}
		defer tx.Rollback()
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM (SELECT id FROM outbox FOR UPDATE SKIP LOCKED) t").Scan(&n); err != nil {
			t.Error(err)
			return -1
		}
		return n
	}
	var (
		calls     atomic.Int32
		claimedAt atomic.Int32 // rows claimed when Leading was first asked
	)
	notLeading := func(c *poller.Config) {
		c.Workers = 1
		c.Leading = func() bool {
			if calls.Add(1) == 1 {
				claimedAt.Store(int32(rows - lockable()))
			}
			return false
		}
	}

	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := e.poller(t, notLeading).Run(runCtx)
	if runCtx.Err() != nil {
		t.Fatalf("Run returned (%v) only when its context ended, want at once by itself", err)
	}
	cancel()
	if !errors.Is(err, leadership.ErrLeaseExpired) {
		t.Fatalf("Run: %v, want an error wrapping leadership.ErrLeaseExpired", err)
	}
	t.Logf("Run: %v", err)
	if n := calls.Load(); n != 1 {
		t.Errorf("Leading called %d times, want once (one round, then Run ends)", n)
	}
	// One worker, a batch of 500: the round claims every partition's head
	// and the rows that follow.
	if n := claimedAt.Load(); n != rows {
		t.Errorf("%d rows claimed when Leading was asked, want all %d: the round's claim comes first", n, rows)
	}
	if n := count(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox"); n != rows {
		t.Fatalf("%d rows pending after the round, want all %d", n, rows)
	}
	if n := lockable(); n != rows {
		t.Fatalf("%d of %d rows lockable after Run returned, want the round rolled back", n, rows)
	}
	if n := count(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox_failed"); n != 0 {
		t.Fatalf("%d rows in outbox_failed", n)
	}

	n, err := e.poller(t, notLeading).Drain(ctx)
	if n != 0 || !errors.Is(err, leadership.ErrLeaseExpired) {
		t.Fatalf("Drain: %d, %v; want 0 and an error wrapping leadership.ErrLeaseExpired", n, err)
	}
	if got := v.Received(); got != 0 {
		t.Fatalf("%d messages arrived from a poller that was not leading", got)
	}

	// Leading: every row once. A message published by the rounds above
	// would arrive twice.
	n, err = e.poller(t, func(c *poller.Config) { c.Leading = func() bool { return true } }).Drain(ctx)
	if err != nil || n != rows {
		t.Fatalf("Drain while leading: %d, %v; want %d", n, err, rows)
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
}

// The due-time sweep of binlog mode asks Leading too: a due delayed row is
// claimed, not published, and stays pending.
func TestNotLeadingSweepsNothing(t *testing.T) {
	e := setup(t, checkpoint.Delete)
	v := consume(t, e.broker)
	ctx := testenv.Context(t, time.Minute)
	if _, err := e.pool.ExecContext(ctx, `INSERT INTO outbox (message_id, partition_key, routing_key, payload, available_at)
		VALUES (UNHEX(REPLACE(UUID(), '-', '')), 'k', 'r', '{}', UTC_TIMESTAMP(6) - INTERVAL 1 SECOND)`); err != nil {
		t.Fatal(err)
	}
	var asked atomic.Bool
	s, err := e.poller(t, func(c *poller.Config) { c.Leading = func() bool { asked.Store(true); return false } }).NewDelayedSweeper()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n, err := s.Round(ctx)
	if n != 0 || !errors.Is(err, leadership.ErrLeaseExpired) || !asked.Load() {
		t.Fatalf("Round: %d, %v (Leading asked: %v); want 0 and an error wrapping leadership.ErrLeaseExpired", n, err, asked.Load())
	}
	if n := count(ctx, t, e.pool, "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL"); n != 1 {
		t.Fatalf("%d rows pending, want the delayed one", n)
	}
	if got := v.Received(); got != 0 {
		t.Fatalf("%d messages arrived from a sweeper that was not leading", got)
	}
}

// The due-time sweep's look: the earliest available_at of the pending
// delayed rows (not of a delivered one, nor of an immediate row), zero when
// there is none, and the server's UTC clock.
func TestDelayedSweeperEarliest(t *testing.T) {
	e := setup(t, checkpoint.Mark)
	ctx := testenv.Context(t, time.Minute)
	s, err := e.poller(t, nil).NewDelayedSweeper()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	earliest, now, err := s.Earliest(ctx)
	if err != nil || !earliest.IsZero() {
		t.Fatalf("Earliest on an empty outbox: %v, %v; want the zero time", earliest, err)
	}
	if skew := time.Since(now); skew < -time.Second || skew > time.Second {
		t.Fatalf("server clock %v is %v off this machine's, whose server it is", now, skew)
	}
	for _, q := range []string{
		// delivered (marked): not pending
		"UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, UTC_TIMESTAMP(6)",
		"UTC_TIMESTAMP(6) + INTERVAL 2 HOUR, NULL",
		"UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, NULL",
		"NULL, NULL", // immediate
	} {
		if _, err := e.pool.ExecContext(ctx, `INSERT INTO outbox (message_id, partition_key, routing_key, payload, available_at, delivered_at)
			VALUES (UNHEX(REPLACE(UUID(), '-', '')), 'k', 'r', '{}', `+q+`)`); err != nil {
			t.Fatal(err)
		}
	}
	earliest, now, err = s.Earliest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in := earliest.Sub(now); in < 59*time.Minute || in > time.Hour {
		t.Fatalf("earliest pending delayed row due %v after the server's now, want the one an hour ahead", in)
	}
}
