package relay

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// 500 delayed rows of 50 keys, due 20 s after they are written, on a
// private server (every statement logged is its relays'): for the first
// 15 s the due-time sweep sends nothing (the heartbeat and the backlog
// count go on); then the relay restarts with every row still delayed (the
// stream will not read them again: the new term's one look finds them);
// every row arrives once, no earlier than its due time and at most
// --poll-interval + 5 s after it, in order per key; plus, on a busy
// machine, what a message written (not delayed) at the first due time
// takes to arrive then: the load's cost to any message, not the sweep's.
func TestDelayedRowsWaitWithoutStatements(t *testing.T) {
	t.Parallel() // its own server; the test mostly waits for the due time
	srv, db, b := privateSetup(t)
	root := srv.Root(t)
	ctx := testenv.WorkContext(t)
	v := consume(t, b, b.Queue)
	defaults := func(c *Config) { c.Mode = ModeBinlog; c.CheckpointInterval = 0 }
	stop := startRelay(t, db, b, defaults) // returns once the relay tails: its look found nothing
	for _, q := range []string{"SET GLOBAL log_output = 'TABLE'", "TRUNCATE mysql.general_log", "SET GLOBAL general_log = ON"} {
		if _, err := root.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	const rows, keys = 500, 50
	written := time.Now()
	msgs := make([]outbox.Message, rows)
	due := make(map[string]time.Time, rows)
	for i := range msgs {
		// Due 20 s from now, spread over one second in id order: several
		// due times, each key's rows due oldest first.
		msgs[i] = outbox.Message{PartitionKey: fmt.Sprintf("key-%d", i%keys), RoutingKey: "rk",
			Payload: fmt.Appendf(nil, `{"n":%d}`, i), AvailableAt: written.Add(20*time.Second + time.Duration(i)*2*time.Millisecond)}
	}
	ids, err := outbox.Enqueue(ctx, db.SQL, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		v.Expect(validator.Expected{ID: ids[i], PartitionKey: m.PartitionKey, Exchange: b.Exchange, RoutingKey: m.RoutingKey, Payload: m.Payload})
		due[ids[i].String()] = m.AvailableAt
	}
	q0 := serverQuestions(ctx, t, root)
	// The window under test is 15 s of waiting: the wait is the measurement.
	time.Sleep(time.Until(written.Add(15 * time.Second)))
	total := serverQuestions(ctx, t, root) - q0 - 1 // the second SHOW counts itself
	if _, err := root.ExecContext(ctx, "SET GLOBAL general_log = OFF"); err != nil {
		t.Fatal(err)
	}
	t.Logf("statements while 500 rows waited: %d in %v (%.2f/s)", total, time.Since(written).Round(time.Second),
		float64(total)/time.Since(written).Seconds())
	if n := sweepStatements(ctx, t, root); n > 0 {
		t.Errorf("the due-time sweep sent %d statements while no row was due, want none", n)
	}

	if err := stop(); err != nil {
		t.Fatalf("relay: %v", err)
	}
	startRelay(t, db, b, defaults)
	// A busy machine may restart the relay past the first due times: those
	// rows are measured from the moment it tails again, not from before it
	// ran. Early is early either way.
	restarted := time.Now()
	// A message written, not delayed, when the first row falls due: its
	// way through the binlog, the relay and the broker to the consumer is
	// what the machine's load costs any message just then, which a due
	// row's delivery may take on top of the sweep's --poll-interval.
	time.Sleep(time.Until(written.Add(20 * time.Second)))
	control := outbox.Message{PartitionKey: "control", RoutingKey: "rk", Payload: []byte(`{"control":true}`)}
	controlAt := time.Now()
	cids, err := outbox.Enqueue(ctx, db.SQL, control)
	if err != nil {
		t.Fatal(err)
	}
	v.Expect(validator.Expected{ID: cids[0], PartitionKey: control.PartitionKey, Exchange: b.Exchange, RoutingKey: control.RoutingKey, Payload: control.Payload})
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	arrived := v.Arrivals()
	var path time.Duration
	for i, d := range v.Deliveries() {
		if d.MessageId == cids[0].String() {
			path = arrived[i].Sub(controlAt)
		}
	}
	// The sweep wakes no earlier than the server's clock says: it reckons
	// that clock from the moment its look's answer arrived, so a slow
	// answer (a loaded server) makes the wake late by the answer's time,
	// never early. 5 s covers that on a busy machine (load 24 on 2 cores
	// made it 1.2 s); a sweep that does not wake at the due time at all
	// leaves the rows waiting for good.
	bound := DefaultPollInterval + 5*time.Second + path
	t.Logf("a message written at the first due time took %v to arrive: due rows may take up to %v", path.Round(time.Millisecond), bound.Round(time.Millisecond))
	for i, d := range v.Deliveries() {
		at, delayed := due[d.MessageId]
		if !delayed {
			continue
		}
		late := arrived[i].Sub(at)
		from := at
		if restarted.After(at) {
			from = restarted
		}
		if late < 0 || arrived[i].Sub(from) > bound {
			t.Errorf("message %s due at %s arrived %v after it (the relay tailed again %v after it), want within [0, %v]",
				d.MessageId, at.Format(time.StampMilli), late, restarted.Sub(at).Round(time.Millisecond), bound)
		}
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
}

// sweepStatements counts the statements of the general log that read or
// write the outbox table, other than the backlog count and the test's own
// INSERT.
func sweepStatements(ctx context.Context, t *testing.T, root *sql.DB) int {
	t.Helper()
	n := 0
	for _, q := range outboxStatements(ctx, t, root) {
		if !strings.Contains(q, "COUNT(*)") && !strings.HasPrefix(q, "INSERT INTO") {
			if n < 3 {
				t.Logf("sweep statement: %.200s", q)
			}
			n++
		}
	}
	return n
}
