package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// statusOf runs `status --json` with args and decodes the one relay.
func statusOf(t *testing.T, db *testenv.DB, args ...string) statusJSON {
	t.Helper()
	r := ops(t, db, append([]string{"status", "--json", "--leader-lease", testLease.String()}, args...)...)
	if r.code != 0 {
		t.Fatalf("status: %+v", r)
	}
	var list []statusJSON
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 {
		t.Fatalf("status JSON: %v (%d relays)\n%s", err, len(list), r.stdout)
	}
	return list[0]
}

// waitStatus polls status until ok holds.
func waitStatus(ctx context.Context, t *testing.T, db *testenv.DB, what string, ok func(statusJSON) bool) statusJSON {
	t.Helper()
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	for {
		s := statusOf(t, db)
		if ok(s) {
			return s
		}
		select {
		case <-ctx.Done():
			t.Fatalf("status never showed %s; last: %+v", what, s)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func gtidPos(t *testing.T, db *testenv.DB) string {
	t.Helper()
	var pos string
	if err := db.SQL.QueryRow("SELECT @@GLOBAL.gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	return pos
}

func insertPending(t *testing.T, db *testenv.DB, n int) {
	t.Helper()
	for range n {
		id := newMessageID(t)
		opsExec(t, db, `INSERT INTO outbox (message_id, partition_key, routing_key, payload, created_at)
			VALUES (?, 'k', 'order.paid', '{}', UTC_TIMESTAMP(6) - INTERVAL 30 SECOND)`, id[:])
	}
}

// status and checkpoint against a relay's life: a running leader is shown
// alive with its checkpoint and refuses checkpoint set; after a clean stop
// there is no leader and pending and failed rows are counted; a purged
// position and one the server never had are refused, a current one is
// written (mode binlog, same epoch) and shown; a SIGKILLed leader is shown
// with its heartbeat ageing past the lease, not alive.
func TestCLIStatusAndCheckpoint(t *testing.T) {
	t.Parallel() // servers of its own; mostly waits for leases and exits
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	ctx := testenv.WorkContext(t)
	p := newRelayProc(t, relayArgs(t, db, b, leaderFlags()...)...)
	p.start()
	p.waitLog(ctx, "tailing the binlog")

	// Running: one row delivered, the checkpoint stored.
	insertPending(t, db, 1)
	s := waitStatus(ctx, t, db, "the row delivered and a checkpoint", func(s statusJSON) bool {
		return s.PendingRows == 0 && s.Checkpoint.GTIDSet != nil
	})
	if s.RelayName != "default" || s.Status != "ACTIVE" || s.Mode != "binlog" || s.Epoch < 1 ||
		s.Leader == nil || !s.Leader.Alive || s.Leader.Instance == "" || s.Leader.Since == nil || s.OldestPendingAgeSeconds != nil {
		t.Fatalf("running leader: %+v", s)
	}
	epoch := s.Epoch
	r := ops(t, db, "checkpoint", "set", "--gtid", gtidPos(t, db), "--leader-lease", testLease.String())
	if r.code != 2 || !strings.Contains(r.stderr, "outbox-relay pause") {
		t.Fatalf("checkpoint set with a live leader: %+v", r)
	}

	// Stopped cleanly: no leader; pending and failed rows counted.
	if code, _ := p.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM: exit code %d", code)
	}
	before := gtidPos(t, db)
	insertPending(t, db, 2)
	opsFailed(t, db, 1, newMessageID(t), "k", "", "", "{}", "relay", time.Hour)
	s = statusOf(t, db)
	if s.Leader != nil || s.Epoch != epoch || s.PendingRows != 2 || s.FailedRows != 1 ||
		s.OldestPendingAgeSeconds == nil || *s.OldestPendingAgeSeconds < 30 {
		t.Fatalf("after a clean stop: %+v", s)
	}
	r = ops(t, db, "status")
	if r.code != 0 || !strings.Contains(r.stdout, "leader              none") || !strings.Contains(r.stdout, "pending rows        2, oldest") {
		t.Fatalf("status table: %+v", r)
	}

	// Positions the server does not have are refused.
	srv.PurgeBinlogs(t)
	r = ops(t, db, "checkpoint", "set", "--gtid", before)
	if r.code != 2 || !strings.Contains(r.stderr, "refused") {
		t.Fatalf("checkpoint set to a purged position: %+v", r)
	}
	cur := gtidPos(t, db)
	parts := strings.Split(cur, "-")
	seq, _ := strconv.ParseUint(parts[2], 10, 64)
	ahead := fmt.Sprintf("%s-%s-%d", parts[0], parts[1], seq+1000)
	r = ops(t, db, "checkpoint", "set", "--gtid", ahead)
	if r.code != 2 || !strings.Contains(r.stderr, "refused") {
		t.Fatalf("checkpoint set to a position the server never had: %+v", r)
	}
	if got := statusOf(t, db); *got.Checkpoint.GTIDSet != *s.Checkpoint.GTIDSet {
		t.Fatalf("a refused set changed the checkpoint: %s", *got.Checkpoint.GTIDSet)
	}

	// A current position is written and shown, the epoch unchanged.
	r = ops(t, db, "checkpoint", "set", "--gtid", cur, "--json")
	var set struct {
		RelayName string         `json:"relay_name"`
		Old       checkpointJSON `json:"old"`
		New       checkpointJSON `json:"new"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &set) != nil || set.RelayName != "default" ||
		set.Old.GTIDSet == nil || *set.Old.GTIDSet != *s.Checkpoint.GTIDSet ||
		set.New.GTIDSet == nil || *set.New.GTIDSet != cur || !strings.Contains(r.stderr, "checkpoint set") {
		t.Fatalf("checkpoint set: %+v", r)
	}
	r = ops(t, db, "checkpoint", "show", "--json")
	var show checkpointShowJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &show) != nil || show.Checkpoint.GTIDSet == nil ||
		*show.Checkpoint.GTIDSet != cur || show.Mode != "binlog" || show.Epoch != epoch || show.Leader != nil ||
		show.ModeReason == nil || !strings.Contains(*show.ModeReason, "checkpoint set by an operator") {
		t.Fatalf("checkpoint show after set: %+v", r)
	}

	// A leader SIGKILLed: its heartbeat ages past the lease.
	p.start()
	p.waitLog(ctx, "tailing the binlog")
	waitStatus(ctx, t, db, "the new leader", func(s statusJSON) bool { return s.Leader != nil && s.Leader.Alive && s.Epoch == epoch+1 })
	p.kill()
	s = waitStatus(ctx, t, db, "a leader not alive", func(s statusJSON) bool { return s.Leader != nil && !s.Leader.Alive })
	if s.Leader.HeartbeatAgeSeconds <= testLease.Seconds() || s.Epoch != epoch+1 {
		t.Fatalf("dead leader: %+v", s.Leader)
	}
	// No live leader: set is accepted again.
	if r = ops(t, db, "checkpoint", "set", "--gtid", gtidPos(t, db), "--leader-lease", testLease.String()); r.code != 0 {
		t.Fatalf("checkpoint set with a dead leader: %+v", r)
	}
}

// Usage, unknown relay names and database failures give exit codes 2, 2, 1.
func TestCLIStatusExitCodes(t *testing.T) {
	db := opsDB(t)
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"status"}, 0, ""},
		{[]string{"status", "--json"}, 0, "[]"},
		{[]string{"status", "extra"}, 2, ""},
		{[]string{"status", "--relay-name", "nope"}, 2, "no progress row"},
		{[]string{"status", "--on-delivered", "keep"}, 2, "on-delivered"},
		{[]string{"checkpoint", "show", "--relay-name", "nope"}, 2, "no progress row"},
		{[]string{"checkpoint", "set", "--relay-name", "nope", "--gtid", "0-1-1"}, 2, "no progress row"},
		{[]string{"checkpoint"}, 2, "show or set"},
		{[]string{"checkpoint", "set", "--gtid", "0-1-1", "--file", "f", "--pos", "4"}, 2, "--gtid SET, --file F --pos N or --from-relay NAME"},
		{[]string{"checkpoint", "set", "--file", "f"}, 2, "--pos"},
		{[]string{"checkpoint", "show", "--force"}, 2, "does not take"},
		{[]string{"status", "--mysql-dsn", "root@tcp(127.0.0.1:1)/x"}, 1, "connect"},
	} {
		r := ops(t, db, c.args...)
		out := r.stdout + r.stderr
		if r.code != c.code || !strings.Contains(out, c.msg) {
			t.Errorf("%v: exit %d, want %d with %q\n%s", c.args, r.code, c.code, c.msg, out)
		}
	}
}
