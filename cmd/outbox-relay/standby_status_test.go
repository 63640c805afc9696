package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// instanceOf is the name a relay process goes by in the progress row and
// outbox_relay_instances: host:pid (run has no flag to choose another).
func instanceOf(t *testing.T, p *relayProc) string {
	t.Helper()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s:%d", host, p.cmd.Process.Pid)
}

// standbyNamed is the entry of s.Standbys for instance, nil when absent.
func standbyNamed(s statusJSON, instance string) *standbyJSON {
	for i := range s.Standbys {
		if s.Standbys[i].Instance == instance {
			return &s.Standbys[i]
		}
	}
	return nil
}

// Three relays of one name: status names the leader and lists the other two
// as standbys, alive. A SIGKILLed standby stays listed, and shows as not
// alive once its heartbeat is older than the lease, while the other stays
// alive; a standby stopped with SIGTERM disappears from the list.
func TestStatusShowsStandbys(t *testing.T) {
	t.Parallel() // a server of its own (privateDB); mostly waits for leases and exits
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)

	leader := newRelayProc(t, relayArgs(t, db, b, leaderFlags()...)...)
	leader.start()
	leader.waitLog(ctx, "leading")
	sb1 := newRelayProc(t, relayArgs(t, db, b, leaderFlags()...)...)
	sb2 := newRelayProc(t, relayArgs(t, db, b, leaderFlags()...)...)
	sb1.start()
	sb2.start()
	sb1.waitLog(ctx, "standby: another instance leads")
	sb2.waitLog(ctx, "standby: another instance leads")
	leaderName, name1, name2 := instanceOf(t, leader), instanceOf(t, sb1), instanceOf(t, sb2)

	// A standby records itself before it logs "standby": no wait needed.
	s := statusOf(t, db)
	if s.Leader == nil || s.Leader.Instance != leaderName || !s.Leader.Alive {
		t.Fatalf("leader %+v, want %s alive", s.Leader, leaderName)
	}
	var names []string
	for _, sb := range s.Standbys {
		names = append(names, sb.Instance)
		if !sb.Alive || sb.HeartbeatAgeSeconds > testLease.Seconds() || sb.StartedAt.IsZero() || time.Since(sb.StartedAt) > time.Minute {
			t.Errorf("standby %+v: want alive, a fresh heartbeat and a start time", sb)
		}
	}
	slices.Sort(names)
	want := []string{name1, name2}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("standbys %v, want %v (the leader is %s)", names, want, leaderName)
	}
	r := ops(t, db, "status", "--leader-lease", testLease.String())
	line := grepLines(r.stdout, "standbys")
	if r.code != 0 || !strings.Contains(line, name1) || !strings.Contains(line, name2) || strings.Count(line, ", alive") != 2 {
		t.Fatalf("status text: standbys line %q\n%+v", line, r)
	}
	t.Logf("status text: %s", strings.TrimSpace(line))

	// SIGKILL: nothing removes the row; its heartbeat ages past the lease.
	sb1.kill()
	killed := time.Now()
	// The bounded wait is the assertion: the killed standby beat at most
	// 4/5 of the lease before the kill, so it shows as not alive within the
	// lease (plus slack for a loaded machine). Meanwhile the other standby,
	// which beats every 4/5 of the lease, must stay alive in every reading.
	wctx, cancel := context.WithTimeout(ctx, testLease+10*time.Second)
	defer cancel()
	for {
		s = statusOf(t, db)
		dead, live := standbyNamed(s, name1), standbyNamed(s, name2)
		if dead == nil || live == nil || !live.Alive || len(s.Standbys) != 2 {
			t.Fatalf("after SIGKILL of %s: standbys %+v, want both listed and %s alive", name1, s.Standbys, name2)
		}
		if !dead.Alive {
			if dead.HeartbeatAgeSeconds <= testLease.Seconds() {
				t.Fatalf("killed standby %+v not alive with a heartbeat within the lease", dead)
			}
			t.Logf("killed standby shown not alive %v after SIGKILL (heartbeat %.3fs old)",
				time.Since(killed).Round(time.Millisecond), dead.HeartbeatAgeSeconds)
			break
		}
		select {
		case <-wctx.Done():
			t.Fatalf("killed standby still shown alive %v after SIGKILL: %+v", time.Since(killed).Round(time.Millisecond), dead)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if r := ops(t, db, "status", "--leader-lease", testLease.String()); !strings.Contains(grepLines(r.stdout, "standbys"), name1+" since") ||
		!strings.Contains(r.stdout, "NOT ALIVE") {
		t.Fatalf("status text after SIGKILL: %+v", r)
	}

	// SIGTERM: a clean stop removes its row before the process exits.
	if code, took := sb2.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM of a standby: exit code %d after %v", code, took)
	}
	s = statusOf(t, db)
	if standbyNamed(s, name2) != nil {
		t.Fatalf("standby %s still listed after a clean stop: %+v", name2, s.Standbys)
	}
	if len(s.Standbys) != 1 || s.Standbys[0].Instance != name1 || s.Standbys[0].Alive {
		t.Fatalf("standbys %+v, want only the killed %s, not alive", s.Standbys, name1)
	}
	if s.Leader == nil || s.Leader.Instance != leaderName || !s.Leader.Alive {
		t.Fatalf("leader %+v, want %s alive", s.Leader, leaderName)
	}
}
