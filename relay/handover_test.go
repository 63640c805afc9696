package relay

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// durableSetup is privateSetup on a server that fsyncs the binlog and the
// redo log at every commit. A transaction enters @@gtid_binlog_pos when it
// is written to the binlog and becomes visible after the binlog fsync: the
// fsync widens that gap from a few instructions to a disk flush, so a
// handover that takes its positions carelessly strands rows here.
func durableSetup(t *testing.T) (*testenv.Server, *testenv.DB, *testenv.Broker) {
	t.Helper()
	srv := testenv.StartServer(t, testenv.ServerOptions{ExtraArgs: []string{
		"--sync-binlog=1", "--innodb-flush-log-at-trx-commit=1"}})
	db := srv.CreateDatabase(t)
	db.Migrate(testenv.Context(t, time.Minute), t)
	return srv, db, testenv.RabbitMQ(t)
}

// While eight producers commit small transactions without pause, a relay
// whose progress row says mode=poll is started and stopped cleanly again and
// again: each start runs the poll → binlog handover (read Gs, sweep, read
// Ge, tail from Gs). Every message arrives exactly once, first deliveries
// keep commit order per partition, and the outbox ends empty. A row the
// handover strands (in Gs but not visible to the sweep, or between Gs and Ge
// and not visible to the window's pending check) would either arrive out of
// order, swept up by a later handover, or never, after the last one.
func TestHandoverUnderConcurrentProducers(t *testing.T) {
	t.Parallel()
	_, db, b := durableSetup(t)
	v := consume(t, b, b.Queue)
	ctx := testenv.WorkContext(t)

	// The producers run in rounds until told to stop: the partitions of a
	// producer stay its own from round to round, so commit order per
	// partition is known.
	stopLoad := make(chan struct{})
	loadDone := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stopLoad:
				loadDone <- nil
				return
			default:
			}
			// Paced (at most about 300 messages a second): unpaced
			// producers outran the relay on a busy machine, and each
			// catch-up below then took minutes.
			err := testload.Run(ctx, db.SQL, v, testload.Load{Producers: 8, Partitions: 40, Total: 400,
				BigTxn: 4, BigShare: 0.3, Exchange: b.Exchange, Pace: 50 * time.Millisecond})
			if err != nil {
				loadDone <- err
				return
			}
		}
	}()

	const handovers = 8
	for i := range handovers {
		if i > 0 {
			if _, err := db.SQL.ExecContext(ctx, "UPDATE outbox_relay_progress SET mode = 'poll'"); err != nil {
				t.Fatal(err)
			}
		}
		stop := startRelay(t, db, b, nil) // returns once the handover is done and the relay tails
		// Caught up (almost nothing committed is undelivered) before the
		// next stop, so the next sweep has only what was written while
		// stopped: the producers outrun a sweep that must catch up with
		// everything written since the previous one.
		waitCaughtUp(ctx, t, v, 200)
		if err := stop(); err != nil {
			t.Fatalf("handover %d: %v", i, err)
		}
	}
	close(stopLoad)
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}

	// A last start: a row an earlier handover stranded is not in the binlog
	// after the stored position, so it never comes; or, when the last term
	// stopped inside its handover window, this start sweeps it up, out of
	// order.
	startRelay(t, db, b, nil)
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	t.Logf("%d handovers under load: %d messages, each once, in order per partition", handovers, v.Received())
}

// waitCaughtUp waits until at most lag committed messages are undelivered.
func waitCaughtUp(ctx context.Context, t *testing.T, v *validator.Validator, lag int) {
	t.Helper()
	received := func() int64 { return int64(v.Received()) }
	if err := progress.Wait(ctx, "wait for the relay to catch up", received, func() bool { return v.Missing() <= lag }); err != nil {
		t.Fatalf("the relay never caught up: %d messages undelivered: %v", v.Missing(), err)
	}
}
