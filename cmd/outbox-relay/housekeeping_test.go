package main

// Tests of cleanup, dedup-cleanup, partitions and run --maintenance-interval
// as subprocesses against a real database.

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/maintenance"
)

// opsRow inserts an outbox row created createdAgo ago, marked delivered
// deliveredAgo ago (or pending when deliveredAgo < 0).
func opsRow(t *testing.T, db *testenv.DB, createdAgo, deliveredAgo time.Duration) {
	t.Helper()
	id := newMessageID(t)
	var delivered any
	if deliveredAgo >= 0 {
		delivered = deliveredAgo.Microseconds()
	}
	opsExec(t, db, `INSERT INTO outbox (message_id, routing_key, payload, created_at, delivered_at)
		VALUES (?, 'rk', '{}', UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, IF(? IS NULL, NULL, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND))`,
		id[:], createdAgo.Microseconds(), delivered, delivered)
}

const cliDay = 24 * time.Hour

// cleanup: --older-than is required; the dry run counts; the cleanup
// deletes only rows marked delivered before the cutoff, in batches.
func TestCLICleanup(t *testing.T) {
	db := opsDB(t)
	for range 5 {
		opsRow(t, db, 20*cliDay, 10*cliDay) // old, delivered: deleted
		opsRow(t, db, 20*cliDay, -1)        // old, pending: kept
		opsRow(t, db, 2*cliDay, cliDay)     // delivered yesterday: kept
	}
	if r := ops(t, db, "cleanup"); r.code != 2 || !strings.Contains(r.stderr, "--older-than") {
		t.Fatalf("cleanup without --older-than: %+v", r)
	}
	if r := ops(t, db, "cleanup", "--older-than", "7d", "--batch-size", "0"); r.code != 2 {
		t.Fatalf("cleanup --batch-size 0: %+v", r)
	}
	r := ops(t, db, "cleanup", "--older-than", "7d", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "would delete 5 delivered rows of outbox") || opsCount(t, db, "SELECT COUNT(*) FROM outbox") != 15 {
		t.Fatalf("cleanup --dry-run: %+v", r)
	}
	r = ops(t, db, "cleanup", "--older-than", "168h", "--batch-size", "2", "--json")
	var res struct {
		Table   string `json:"table"`
		Rows    int64  `json:"rows"`
		Batches int    `json:"batches"`
		DryRun  bool   `json:"dry_run"`
		Cutoff  string `json:"cutoff"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.Table != "outbox" || res.Rows != 5 || res.Batches != 3 || res.DryRun {
		t.Fatalf("cleanup --json: %+v\n%+v", r, res)
	}
	if n := opsCount(t, db, "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL"); n != 5 {
		t.Fatalf("%d pending rows left, want 5", n)
	}
	if n := opsCount(t, db, "SELECT COUNT(*) FROM outbox"); n != 10 {
		t.Fatalf("%d rows left, want 10", n)
	}
}

func opsDedup(t *testing.T, db *testenv.DB, consumer string, ago time.Duration) {
	t.Helper()
	id := newMessageID(t)
	opsExec(t, db, `INSERT INTO message_deduplication (consumer, message_id, message_name, processed_at)
		VALUES (?, ?, 'order.placed', UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)`, consumer, id[:], ago.Microseconds())
}

// dedup-cleanup: an age below the floor (7 days unless --dedup-min-age says
// otherwise) is refused with exit 2 naming --force; with --force, or above
// the floor, the records older than the age go, of one --consumer or all.
func TestCLIDedupCleanup(t *testing.T) {
	db := opsDB(t)
	for range 3 {
		opsDedup(t, db, "billing", 10*cliDay)
		opsDedup(t, db, "shipping", 10*cliDay)
		opsDedup(t, db, "billing", 2*cliDay)
	}
	r := ops(t, db, "dedup-cleanup", "--older-than", "1d")
	if r.code != 2 || !strings.Contains(r.stderr, "--force") || !strings.Contains(r.stderr, "7d") ||
		opsCount(t, db, "SELECT COUNT(*) FROM message_deduplication") != 9 {
		t.Fatalf("dedup-cleanup below the floor: %+v", r)
	}
	r = ops(t, db, "dedup-cleanup", "--older-than", "7d", "--consumer", "billing")
	if r.code != 0 || !strings.Contains(r.stdout, "deleted 3 inbox records") ||
		opsCount(t, db, "SELECT COUNT(*) FROM message_deduplication WHERE consumer = 'shipping'") != 3 {
		t.Fatalf("dedup-cleanup --consumer billing: %+v", r)
	}
	r = ops(t, db, "dedup-cleanup", "--older-than", "1d", "--force", "--dry-run", "--json")
	var res struct {
		Rows   int64 `json:"rows"`
		DryRun bool  `json:"dry_run"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.Rows != 6 || !res.DryRun {
		t.Fatalf("dedup-cleanup --force --dry-run --json: %+v", r)
	}
	r = ops(t, db, "dedup-cleanup", "--older-than", "3d", "--dedup-min-age", "3d")
	if r.code != 0 || opsCount(t, db, "SELECT COUNT(*) FROM message_deduplication") != 3 {
		t.Fatalf("dedup-cleanup with a lowered floor: %+v", r)
	}
}

// partitions --once adds the lookahead days; while another instance holds
// the table's partitions lock it skips (exit 0, saying so); an
// unpartitioned table is refused with exit 2.
func TestCLIPartitions(t *testing.T) {
	db := opsDB(t, "--partitioned")
	r := ops(t, db, "partitions", "--once", "--lookahead", "9", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "would add 3 partitions") {
		t.Fatalf("partitions --dry-run: %+v", r)
	}
	conn, err := db.SQL.Conn(testenv.Context(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lock := maintenance.PartitionsLockName(db.Name, "outbox")
	if _, err := conn.ExecContext(t.Context(), "DO GET_LOCK(?, 0)", lock); err != nil {
		t.Fatal(err)
	}
	r = ops(t, db, "partitions", "--once", "--lookahead", "9")
	if r.code != 0 || !strings.Contains(r.stdout, "skipped") {
		t.Fatalf("partitions while another instance holds the lock: %+v", r)
	}
	if _, err := conn.ExecContext(t.Context(), "DO RELEASE_LOCK(?)", lock); err != nil {
		t.Fatal(err)
	}
	r = ops(t, db, "partitions", "--once", "--lookahead", "9", "--json")
	var rep struct {
		Table   string   `json:"table"`
		Skipped bool     `json:"skipped"`
		Added   []string `json:"added"`
		Dropped []string `json:"dropped"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.Skipped || len(rep.Added) != 3 || rep.Dropped == nil {
		t.Fatalf("partitions --json: %+v\n%+v", r, rep)
	}
	if n := opsCount(t, db, `SELECT COUNT(*) FROM information_schema.PARTITIONS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox'`); n != 11 {
		t.Fatalf("%d partitions, want 11 (today, 9 days ahead, pmax)", n)
	}

	plain := opsDB(t)
	if r := ops(t, plain, "partitions", "--once"); r.code != 2 || !strings.Contains(r.stderr, "not partitioned") {
		t.Fatalf("partitions on an unpartitioned table: %+v", r)
	}
}

// run --maintenance-interval: the leader cleans up delivered rows (mark
// mode) and keeps the partitions of a partitioned table, without an
// operator.
func TestCLIRunMaintenance(t *testing.T) {
	ctx := testenv.WorkContext(t)
	db := opsDB(t, "--partitioned")
	b := testenv.RabbitMQ(t)
	for range 3 {
		opsRow(t, db, 0, 10*cliDay)
	}
	opsRow(t, db, 0, -1)
	relay := newRelayProc(t, relayArgs(t, db, b, "--mode", "poll", "--on-delivered", "mark",
		"--maintenance-interval", "1h", "--cleanup-older-than", "7d", "--lookahead", "9")...)
	relay.start()
	step, cancel := progress.Step(ctx)
	defer cancel()
	for {
		parts := opsCount(t, db, `SELECT COUNT(*) FROM information_schema.PARTITIONS
			WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox'`)
		old := opsCount(t, db, "SELECT COUNT(*) FROM outbox WHERE delivered_at < UTC_TIMESTAMP(6) - INTERVAL 7 DAY")
		if parts == 11 && old == 0 {
			break
		}
		if !relay.running() {
			t.Fatalf("relay exited; %d partitions, %d old delivered rows", parts, old)
		}
		select {
		case <-step.Done():
			t.Fatalf("maintenance did not run: %d partitions (want 11), %d old delivered rows (want 0): %v", parts, old, step.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	// The pending row was delivered and marked, not deleted.
	step, cancel = progress.Step(ctx)
	defer cancel()
	for opsCount(t, db, "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL") != 0 {
		select {
		case <-step.Done():
			t.Fatal("the pending row was not delivered")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if n := opsCount(t, db, "SELECT COUNT(*) FROM outbox"); n != 1 {
		t.Fatalf("%d rows in the outbox, want the 1 delivered just now", n)
	}
	if code, _ := relay.terminate(30 * time.Second); code != 0 {
		t.Fatalf("relay exit code %d", code)
	}
}

// The new commands are listed, and --help explains the age forms.
func TestCLIHousekeepingHelp(t *testing.T) {
	bin := relayBinary(t)
	r := runBinary(t, bin, nil, "help")
	for _, name := range []string{"failed", "cleanup", "dedup-cleanup", "partitions"} {
		if !strings.Contains(r.stdout, "\n  "+name+" ") {
			t.Errorf("help does not list %s:\n%s", name, r.stdout)
		}
	}
	for _, name := range []string{"failed", "cleanup", "dedup-cleanup", "partitions"} {
		r := runBinary(t, bin, nil, name, "--help")
		if r.code != 0 || !strings.Contains(r.stdout, "7d") {
			t.Errorf("%s --help: %+v", name, r)
		}
	}
	r = runBinary(t, bin, nil, "run", "--help")
	if !strings.Contains(r.stdout, "--maintenance-interval") {
		t.Errorf("run --help has no --maintenance-interval:\n%s", r.stdout)
	}
}
