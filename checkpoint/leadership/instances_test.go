package leadership_test

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// BeatInstance inserts, then updates role and heartbeat keeping started_at;
// it deletes the relay name's rows whose heartbeat is over an hour old, and
// only those; RemoveInstance deletes this process's row. ReadInstances
// judges Alive by the lease.
func TestBeatInstance(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	elector := func(relay, instance string) *leadership.Elector {
		return newElector(t, db, leadership.Config{RelayName: relay, Instance: instance})
	}
	a, b := elector("r1", "host-a:1"), elector("r1", "host-b:2")
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	read := func(relay string) map[string]operator.InstanceState {
		t.Helper()
		list, err := operator.ReadInstances(ctx, db, relay, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]operator.InstanceState{}
		for _, i := range list {
			m[i.RelayName+"/"+i.Instance] = i
		}
		return m
	}

	if err := a.BeatInstance(ctx, leadership.RoleStandby); err != nil {
		t.Fatal(err)
	}
	if err := a.BeatInstance(ctx, "follower"); err == nil {
		t.Fatal("BeatInstance accepted an unknown role")
	}
	// Pretend a beat long ago: started_at must survive the next beat.
	exec("UPDATE outbox_relay_instances SET started_at = started_at - INTERVAL 10 MINUTE, heartbeat = heartbeat - INTERVAL 30 SECOND")
	if got := read("r1")["r1/host-a:1"]; got.Alive || got.HeartbeatAgeSeconds < 30 {
		t.Fatalf("a row 30 s without a beat, lease 10 s: %+v, want not alive", got)
	}
	if err := a.BeatInstance(ctx, leadership.RoleLeader); err != nil {
		t.Fatal(err)
	}
	got := read("r1")["r1/host-a:1"]
	if got.Role != leadership.RoleLeader || !got.Alive || got.HeartbeatAgeSeconds > 5 ||
		time.Since(got.StartedAt) < 9*time.Minute || time.Since(got.StartedAt) > 11*time.Minute {
		t.Fatalf("after a second beat: %+v, want role leader, alive, started_at 10 minutes ago", got)
	}

	// Stale rows: of r1 one just past the hour, one just inside it; of r2 one
	// past it (another relay name: left alone).
	exec(`INSERT INTO outbox_relay_instances (relay_name, instance, role, started_at, heartbeat) VALUES
		('r1', 'dead:1', 'standby', UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, UTC_TIMESTAMP(6) - INTERVAL 61 MINUTE),
		('r1', 'quiet:2', 'standby', UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, UTC_TIMESTAMP(6) - INTERVAL 59 MINUTE),
		('r2', 'dead:3', 'standby', UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, UTC_TIMESTAMP(6) - INTERVAL 61 MINUTE)`)
	if err := b.BeatInstance(ctx, leadership.RoleStandby); err != nil {
		t.Fatal(err)
	}
	all := read("")
	for _, k := range []string{"r1/host-a:1", "r1/host-b:2", "r1/quiet:2", "r2/dead:3"} {
		if _, ok := all[k]; !ok {
			t.Errorf("%s deleted, want it kept", k)
		}
	}
	if _, ok := all["r1/dead:1"]; ok {
		t.Errorf("r1/dead:1 (no beat for 61 minutes) kept, want it deleted")
	}
	if len(read("r1")) != 3 || len(read("r2")) != 1 {
		t.Errorf("ReadInstances by relay name: r1 %v, r2 %v", read("r1"), read("r2"))
	}

	if err := b.RemoveInstance(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.RemoveInstance(ctx); err != nil {
		t.Fatalf("removing a row that is gone: %v", err)
	}
	if _, ok := read("r1")["r1/host-b:2"]; ok {
		t.Fatal("host-b:2 still there after RemoveInstance")
	}
}
