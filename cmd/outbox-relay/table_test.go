package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// syncBuffer is a bytes.Buffer an in-process command writes while the test
// reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// inProc is `outbox-relay run` running in this process (run, as main
// calls it) until stop.
type inProc struct {
	t      *testing.T
	stderr syncBuffer
	cancel context.CancelFunc
	done   chan int // the exit code, once run returned
}

// startRun runs args (a command line without the program name) in this
// process until the test ends or stop is called.
func startRun(t *testing.T, args ...string) *inProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &inProc{t: t, cancel: cancel, done: make(chan int, 1)}
	go func() {
		var stdout bytes.Buffer
		p.done <- run(ctx, args, &stdout, &p.stderr, envMap(nil))
	}()
	t.Cleanup(func() { p.stop() })
	return p
}

// stop ends the run like SIGTERM and returns its exit code.
func (p *inProc) stop() int {
	p.cancel()
	select {
	case code := <-p.done:
		p.done <- code
		return code
	case <-time.After(time.Minute):
		p.t.Errorf("relay did not stop within a minute of shutdown; its log:\n%s", p.stderr.String())
		return -1
	}
}

// waitLog waits until the run's log holds want; it fails if the run ends first.
func (p *inProc) waitLog(ctx context.Context, want string) {
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	p.t.Helper()
	for !strings.Contains(p.stderr.String(), want) {
		select {
		case code := <-p.done:
			p.done <- code
			p.t.Fatalf("relay exited (code %d) before logging %q:\n%s", code, want, p.stderr.String())
		case <-ctx.Done():
			p.t.Fatalf("relay never logged %q:\n%s", want, p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// runCmd runs one command line in this process and returns its exit code,
// stdout and stderr.
func runCmd(ctx context.Context, args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, &stdout, &stderr, envMap(nil))
	return code, stdout.String(), stderr.String()
}

// liveLog is what a relay of mode logs once it delivers live.
func liveLog(mode string) string {
	if mode == "poll" {
		return "polling the outbox table"
	}
	return "tailing the binlog"
}

// Two relay names on one outbox table (a deploy that changed --relay-name,
// a manifest copied without changing --table): the second is refused with
// exit 2 in every mode, naming the first relay name, its instance and
// heartbeat age and the fix; the first keeps delivering, and every message
// arrives exactly once. A third relay name whose row is stale (its process
// was killed long ago) does not stand in the way. status lists the names
// of the table with their leaders.
func TestRunRefusesSecondRelayNameOnTable(t *testing.T) {
	for _, mode := range []string{"binlog", "poll"} {
		t.Run(mode, func(t *testing.T) {
			ctx := testenv.WorkContext(t)
			db := testenv.MySQL(t).Migrate(ctx, t)
			b := testenv.RabbitMQ(t)
			v := consumeAll(t, b)
			if _, err := db.SQL.ExecContext(ctx, `INSERT INTO outbox_relay_progress (relay_name, outbox_table, epoch,
				leader_instance, leader_since, leader_heartbeat, leader_lease_ms) VALUES ('acc-old', 'outbox', 3, 'gone:1',
				UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, 10000)`); err != nil {
				t.Fatal(err)
			}
			first := startRun(t, append([]string{"run"}, relayArgs(t, db, b, "--relay-name", "acc", "--mode", mode, "--metrics-addr", "")...)...)
			first.waitLog(ctx, liveLog(mode))
			load := testload.Load{Producers: 2, Partitions: 20, Total: 300, Exchange: b.Exchange}
			testload.Produce(ctx, t, db.SQL, v, load)

			host, _ := os.Hostname()
			instance := fmt.Sprintf("%s:%d", host, os.Getpid())
			for _, second := range []string{mode, "auto"} {
				code, _, stderr := runCmd(ctx, append([]string{"run"}, relayArgs(t, db, b, "--relay-name", "acc-other", "--mode", second, "--metrics-addr", "")...)...)
				last := lastLine(stderr)
				if code != exitUsage {
					t.Fatalf("second relay name in mode %s: exit %d, want %d; stderr:\n%s", second, code, exitUsage, stderr)
				}
				for _, want := range []string{`refusing to lead relay name "acc-other"`, `relay name "acc"`, "leader " + instance, "heartbeat",
					`Stop the relay of name "acc"`, `--relay-name "acc"`} {
					if !strings.Contains(last, want) {
						t.Errorf("mode %s: refusal %q does not say %q", second, last, want)
					}
				}
			}
			testload.Produce(ctx, t, db.SQL, v, load) // the first delivers on, alone
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := v.WaitComplete(wctx); err != nil {
				t.Fatal(err)
			}
			if err := v.Check(validator.ExactlyOnce); err != nil {
				t.Fatalf("%v (%d duplicates)", err, v.Duplicates())
			}
			if !strings.Contains(first.stderr.String(), liveLog(mode)) || len(first.done) != 0 {
				t.Fatal("the first relay stopped")
			}
			checkTableStatus(ctx, t, db, instance)
		})
	}
}

// checkTableStatus checks status --relay-name acc --json: the table, the
// live leader, and the other relay names of the table: acc-other refused
// (FAILED, no leader, the refusal as its last error), acc-old not alive.
func checkTableStatus(ctx context.Context, t *testing.T, db *testenv.DB, instance string) {
	t.Helper()
	code, stdout, stderr := runCmd(ctx, "status", "--mysql-dsn", db.DSN, "--relay-name", "acc", "--json")
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, stderr)
	}
	var got []statusJSON
	if err := json.Unmarshal([]byte(stdout), &got); err != nil || len(got) != 1 {
		t.Fatalf("status --json: %v: %s", err, stdout)
	}
	s := got[0]
	if s.Table == nil || *s.Table != "outbox" || s.Leader == nil || s.Leader.Instance != instance || !s.Leader.Alive {
		t.Fatalf("status of acc: table %v, leader %+v; want outbox, %s alive", s.Table, s.Leader, instance)
	}
	if len(s.OtherRelayNames) != 2 {
		t.Fatalf("other relay names of the table: %+v, want acc-old and acc-other", s.OtherRelayNames)
	}
	old, other := s.OtherRelayNames[0], s.OtherRelayNames[1]
	if old.RelayName != "acc-old" || old.Leader == nil || old.Leader.Alive {
		t.Errorf("acc-old: %+v, want listed with a leader not alive", old)
	}
	if other.RelayName != "acc-other" || other.Status != "FAILED" || other.Leader != nil {
		t.Errorf("acc-other: %+v, want FAILED without a leader", other)
	}
	rows, err := operator.ReadStatus(ctx, db.SQL, "acc-other", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rows[0].LastError, `relay name "acc"`) {
		t.Errorf("acc-other's last error %q does not name relay acc", rows[0].LastError)
	}
}

// Moving a deployment to another relay name on purpose: the relays of the
// old name are stopped, `checkpoint set --from-relay` gives the new name
// the old one's checkpoint and mode, and the new name resumes there:
// nothing lost, nothing repeated (the old one stopped cleanly, so nothing
// it published is unacknowledged). The new name had run before, long ago:
// resuming from its own checkpoint would publish again everything the old
// name delivered since.
func TestRenameRelayResumesFromOldName(t *testing.T) {
	for _, mode := range []string{"binlog", "poll"} {
		t.Run(mode, func(t *testing.T) {
			ctx := testenv.WorkContext(t)
			db := testenv.MySQL(t).Migrate(ctx, t)
			b := testenv.RabbitMQ(t)
			v := consumeAll(t, b)
			load := testload.Load{Producers: 2, Partitions: 20, Total: 200, Exchange: b.Exchange}
			args := func(name string) []string {
				return append([]string{"run"}, relayArgs(t, db, b, "--relay-name", name, "--mode", mode, "--metrics-addr", "")...)
			}
			// The new name's earlier life, then the old name's.
			for _, name := range []string{"blue", "green"} {
				p := startRun(t, args(name)...)
				p.waitLog(ctx, liveLog(mode))
				testload.Produce(ctx, t, db.SQL, v, load)
				waitDelivered(ctx, t, v)
				if code := p.stop(); code != 0 {
					t.Fatalf("stop %s: exit %d:\n%s", name, code, p.stderr.String())
				}
			}
			testload.Produce(ctx, t, db.SQL, v, load) // while no relay runs

			code, stdout, stderr := runCmd(ctx, "checkpoint", "set", "--mysql-dsn", db.DSN, "--relay-name", "blue", "--from-relay", "green")
			if code != 0 || !strings.Contains(stdout, "copied from relay green") {
				t.Fatalf("checkpoint set --from-relay: exit %d\n%s%s", code, stdout, stderr)
			}
			p := startRun(t, args("blue")...)
			p.waitLog(ctx, liveLog(mode))
			testload.Produce(ctx, t, db.SQL, v, load)
			waitDelivered(ctx, t, v)
			if err := v.Check(validator.ExactlyOnce); err != nil {
				t.Fatalf("%v (%d duplicates)", err, v.Duplicates())
			}
		})
	}
}

// waitDelivered waits until every message produced so far has arrived.
func waitDelivered(ctx context.Context, t *testing.T, v *validator.Validator) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := v.WaitComplete(wctx); err != nil {
		t.Fatal(err)
	}
}

// checkpoint set --from-relay refuses, with exit 2: a relay name that is
// still leading (also one whose heartbeat is older than this command's
// --leader-lease but within the lease its leader recorded), one that
// publishes another table, the name itself.
func TestCheckpointFromRelayRefusals(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := testenv.MySQL(t).Migrate(ctx, t)
	if _, err := db.SQL.ExecContext(ctx, `INSERT INTO outbox_relay_progress (relay_name, outbox_table, epoch,
		leader_instance, leader_since, leader_heartbeat) VALUES
		('live', 'outbox', 1, 'h:1', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)),
		('elsewhere', 'orders_outbox', 1, NULL, NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.SQL.ExecContext(ctx, `INSERT INTO outbox_relay_progress (relay_name, outbox_table, epoch,
		leader_instance, leader_since, leader_heartbeat, leader_lease_ms) VALUES
		('long-lease', 'outbox', 1, 'h:2', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL 30 SECOND, 60000)`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		from, want string
	}{
		{"live", `relay "live" still leads (h:1`},
		{"long-lease", `relay "long-lease" still leads (h:2`},
		{"elsewhere", `relay "elsewhere" publishes outbox table "orders_outbox", not --table "outbox"`},
		{"new", `--from-relay "new" is --relay-name itself`},
		{"nobody", "no relay has run with this --relay-name yet"},
	} {
		code, _, stderr := runCmd(ctx, "checkpoint", "set", "--mysql-dsn", db.DSN, "--relay-name", "new", "--from-relay", c.from)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("--from-relay %s: exit %d, stderr %q; want exit %d with %q", c.from, code, stderr, exitUsage, c.want)
		}
	}
	var n int
	if err := db.SQL.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox_relay_progress WHERE relay_name = 'new'").Scan(&n); err != nil || n != 0 {
		t.Errorf("a refused copy created the new name's row: %d, %v", n, err)
	}
}

// status lists, for a relay name, the other relay names recorded on its
// table with their status and leader, and nothing of other tables; none
// while its own table is unknown.
func TestOthersOnTable(t *testing.T) {
	all := []operator.RelayStatus{
		{RelayName: "acc", Table: "outbox", Status: "ACTIVE", Leader: &operator.LeaderState{Instance: "h:1", Alive: true}},
		{RelayName: "acc-other", Table: "outbox", Status: "FAILED"},
		{RelayName: "billing", Table: "billing_outbox", Status: "ACTIVE"},
		{RelayName: "legacy", Status: "ACTIVE"},
	}
	got := othersOnTable(all[0], all)
	if len(got) != 1 || got[0].RelayName != "acc-other" || got[0].Status != "FAILED" || got[0].Leader != nil {
		t.Fatalf("others of acc: %+v, want acc-other alone", got)
	}
	if got := othersOnTable(all[3], all); got == nil || len(got) != 0 {
		t.Fatalf("others of a relay whose table is unknown: %#v, want []", got)
	}
	var w bytes.Buffer
	list := []statusJSON{{RelayName: "acc", Table: orNull("outbox"), OtherRelayNames: othersOnTable(all[1], all)}}
	if err := printStatus(&w, list); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"table               outbox", "other relay names   acc: ACTIVE, leader h:1 since ?"} {
		if !strings.Contains(w.String(), want) {
			t.Errorf("status text does not hold %q:\n%s", want, w.String())
		}
	}
}
