package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// An unset --leader-lease follows --heartbeat-interval as the library's
// does (5 heartbeats when that is longer than 10s): run with only a slower
// heartbeat starts and tails, where it used to exit 2 with "leader-lease
// 10s: at least 3 heartbeat intervals".
func TestRunLeaseFollowsHeartbeat(t *testing.T) {
	ctx := testenv.WorkContext(t)
	db := testenv.MySQL(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	p := newRelayProc(t, relayArgs(t, db, b, "--heartbeat-interval", "4s")...)
	p.start()
	p.waitLog(ctx, "tailing the binlog")
	if code, took := p.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM: exit code %d after %v", code, took)
	}
}

// A lease given explicitly is still checked against the heartbeat, and the
// refusal names the flags.
func TestRunLeaseShorterThanHeartbeatsRefused(t *testing.T) {
	base := []string{"run", "--mysql-dsn", "root@tcp(127.0.0.1:1)/db", "--amqp-url", "amqp://guest:guest@127.0.0.1:1/", "--metrics-addr", ""}
	for _, c := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"--heartbeat-interval", "4s", "--leader-lease", "10s"}, nil},
		{nil, map[string]string{"OUTBOX_RELAY_HEARTBEAT_INTERVAL": "4s", "OUTBOX_RELAY_LEADER_LEASE": "10s"}},
	} {
		var stdout, stderr bytes.Buffer
		args := append(append([]string{}, base...), c.args...)
		code := run(context.Background(), args, &stdout, &stderr, envMap(c.env))
		want := "--leader-lease 10s: at least 3 heartbeat intervals (12s)"
		if code != exitUsage || !strings.Contains(stderr.String(), want) {
			t.Errorf("run %q (env %v): exit %d, stderr %q; want exit %d with %q", args, c.env, code, stderr.String(), exitUsage, want)
		}
	}
}
