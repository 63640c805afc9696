package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

type result struct {
	code           int
	stdout, stderr string
}

// runBinary runs bin with args and extra environment variables (and none of
// the caller's OUTBOX_RELAY_ ones).
func runBinary(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code, stdout.String(), stderr.String()}
}

func TestCLIMigrate(t *testing.T) {
	bin := relayBinary(t)
	db := testenv.MySQL(t)

	r := runBinary(t, bin, nil, "migrate", "--mysql-dsn", db.DSN)
	if r.code != 0 || r.stdout != "applied 0001_relay_tables\napplied 0001_outbox:outbox\napplied 0004_dedup_consumer\napplied 0005_progress_mode_reason\napplied 0006_pause_and_instances\napplied 0007_progress_failed_at\napplied 0008_progress_broker\napplied 0009_progress_outbox_table\napplied 0010_progress_stream_ids\napplied 0011_stream_consumer_offsets\n" {
		t.Fatalf("first migrate: %+v", r)
	}
	if !strings.Contains(r.stderr, `"msg":"schema migrated"`) {
		t.Fatalf("no JSON log line on stderr: %q", r.stderr)
	}
	// Second run: nothing to do. The DSN comes from the environment this time.
	r = runBinary(t, bin, []string{"OUTBOX_RELAY_MYSQL_DSN=" + db.DSN}, "migrate", "--log-format", "console")
	if r.code != 0 || r.stdout != "schema is up to date\n" {
		t.Fatalf("second migrate: %+v", r)
	}
	if strings.Contains(r.stderr, `"msg"`) || !strings.Contains(r.stderr, "schema migrated") {
		t.Fatalf("console log expected: %q", r.stderr)
	}

	// A config file names another table, partitioned; the flag on the
	// command line still wins over the file for the DSN.
	cfg := filepath.Join(t.TempDir(), "relay.yaml")
	content := "mysql-dsn: root@tcp(127.0.0.1:1)/wrong\ntable: events_outbox\npartitioned: true\n"
	if err := os.WriteFile(cfg, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	r = runBinary(t, bin, nil, "migrate", "--config", cfg, "--mysql-dsn", db.DSN)
	if r.code != 0 || r.stdout != "applied 0001_outbox:events_outbox\n" {
		t.Fatalf("migrate with config: %+v", r)
	}
	var parts int
	if err := db.SQL.QueryRow(`SELECT COUNT(*) FROM information_schema.PARTITIONS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'events_outbox' AND PARTITION_NAME IS NOT NULL`).Scan(&parts); err != nil || parts < 2 {
		t.Fatalf("events_outbox partitions: %d, %v", parts, err)
	}

	// Unknown config key: exit 2 naming the key.
	if err := os.WriteFile(cfg, []byte("mysql-dsn: x\ntabel: y\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = runBinary(t, bin, nil, "migrate", "--config", cfg)
	if r.code != 2 || !strings.Contains(r.stderr, `unknown key "tabel"`) {
		t.Fatalf("unknown key: %+v", r)
	}
}

func TestCLIMigrateShapeMismatch(t *testing.T) {
	bin := relayBinary(t)
	db := testenv.MySQL(t)
	if _, err := db.SQL.Exec("CREATE TABLE outbox (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, message_id BINARY(16) NOT NULL, partition_key VARCHAR(255) NOT NULL, exchange VARCHAR(255) NOT NULL, routing_key VARCHAR(100) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	r := runBinary(t, bin, nil, "migrate", "--mysql-dsn", db.DSN)
	if r.code != 1 || !strings.Contains(r.stderr, `outbox table "outbox": column "routing_key" is varchar(100), want varchar(255)`) {
		t.Fatalf("shape mismatch: %+v", r)
	}
}

func TestCLIUsageAndVersion(t *testing.T) {
	bin := relayBinary(t)
	r := runBinary(t, bin, nil, "migrate", "--bogus")
	if r.code != 2 || !strings.Contains(r.stderr, "bogus") || strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("bad flag: %+v", r)
	}
	r = runBinary(t, bin, []string{"OUTBOX_RELAY_MYSQL_DSN=root:topsecret@tcp(127.0.0.1:1)/db"}, "migrate")
	if r.code != 1 || strings.Contains(r.stderr, "topsecret") || !strings.Contains(r.stderr, "root:xxxxx@") {
		t.Fatalf("unreachable server: %+v", r)
	}
	r = runBinary(t, bin, nil, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "outbox-relay 9.9.9-test (") || !strings.Contains(r.stdout, runtime.Version()) {
		t.Fatalf("version: %+v", r)
	}
}

func TestCLIMissingDatabase(t *testing.T) {
	bin := relayBinary(t)
	db := testenv.MySQL(t)
	dsn := strings.Replace(db.DSN, "/"+db.Name, "/"+db.Name+"_missing", 1)
	r := runBinary(t, bin, nil, "migrate", "--mysql-dsn", dsn)
	if r.code != 1 || !strings.Contains(r.stderr, "does not exist") || !strings.Contains(r.stderr, "CREATE DATABASE `"+db.Name+"_missing`") {
		t.Fatalf("missing database: %+v", r)
	}
}
