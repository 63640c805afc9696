package main

// Flags that override a refusal count only when typed on the command line.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCLIOverrideFlagsOnlyFromCommandLine: --force, --all and
// --accept-lost-gtids set from the environment or the config file are
// refused with exit code 2 naming the flag, and the command does nothing:
// the failure is not retried, the young inbox record is not deleted, the
// checkpoint of a relay with a live leader is not moved.
func TestCLIOverrideFlagsOnlyFromCommandLine(t *testing.T) {
	db := opsDB(t)
	failedID := newMessageID(t)
	opsFailed(t, db, 1, failedID, "k-1", "orders", "", `{"n":1}`, "relay", time.Hour)
	opsDedup(t, db, "billing", time.Hour) // younger than --dedup-min-age (7d)
	// A relay whose leader is alive, at the server's position; the next
	// position exists on the server, so only the live leader stands in the
	// way of checkpoint set.
	before := gtidPos(t, db)
	opsExec(t, db, `INSERT INTO outbox_relay_progress (relay_name, flavor, gtid_set, epoch, leader_instance, leader_since, leader_heartbeat)
		VALUES ('default', 'mariadb', ?, 1, 'host-1:1', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))`, before)
	after := gtidPos(t, db)

	cases := []struct {
		flag string
		args []string // command, then its arguments; --config goes after the command
	}{
		{"all", []string{"failed", "retry"}},
		{"force", []string{"dedup-cleanup", "--older-than", "1m"}},
		{"force", []string{"checkpoint", "set", "--gtid", after}},
		// An unreachable server: without the check, run fails on the
		// connection (exit 1) instead of refusing the flag (exit 2).
		{"accept-lost-gtids", []string{"run", "--mysql-dsn", "root@tcp(127.0.0.1:1)/outbox", "--metrics-addr", ""}},
	}
	for _, c := range cases {
		for _, from := range []string{"environment", "config file"} {
			t.Run(c.args[0]+"_"+c.flag+"_"+strings.ReplaceAll(from, " ", "_"), func(t *testing.T) {
				// The live leader's heartbeat stays within the lease.
				opsExec(t, db, "UPDATE outbox_relay_progress SET leader_heartbeat = UTC_TIMESTAMP(6)")
				env := []string{"OUTBOX_RELAY_MYSQL_DSN=" + db.DSN, "OUTBOX_RELAY_LOG_FORMAT=console"}
				args := c.args
				if from == "environment" {
					env = append(env, envName(c.flag)+"=true")
				} else {
					file := filepath.Join(t.TempDir(), "relay.yaml")
					if err := os.WriteFile(file, []byte(c.flag+": true\n"), 0o600); err != nil {
						t.Fatal(err)
					}
					args = append([]string{c.args[0], "--config", file}, c.args[1:]...)
				}
				r := runBinary(t, relayBinary(t), env, args...)
				if r.code != 2 || !strings.Contains(r.stderr, "--"+c.flag) || !strings.Contains(r.stderr, "only when typed on the command line") {
					t.Errorf("%s from the %s: exit %d, want 2 with a message naming --%s as command-line only\nstdout: %s\nstderr: %s",
						c.flag, from, r.code, c.flag, r.stdout, r.stderr)
				}
			})
		}
	}

	if n := opsCount(t, db, "SELECT COUNT(*) FROM outbox_failed"); n != 1 {
		t.Errorf("%d failures in outbox_failed, want the 1 nobody retried", n)
	}
	if n := opsCount(t, db, "SELECT COUNT(*) FROM outbox"); n != 0 {
		t.Errorf("%d rows in the outbox, want 0: a failure was retried", n)
	}
	if n := opsCount(t, db, "SELECT COUNT(*) FROM message_deduplication"); n != 1 {
		t.Errorf("%d inbox records, want the 1 younger than --dedup-min-age", n)
	}
	var gtid string
	if err := db.SQL.QueryRow("SELECT gtid_set FROM outbox_relay_progress WHERE relay_name = 'default'").Scan(&gtid); err != nil {
		t.Fatal(err)
	}
	if gtid != before {
		t.Errorf("checkpoint moved from %q to %q under a live leader", before, gtid)
	}
}
