package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// progressStatus is the progress row's status, whether failed_at is set, and
// last_error.
type progressStatus struct {
	status    string
	failedAt  bool
	lastError string
}

func readProgressStatus(ctx context.Context, t *testing.T, db *sql.DB, relayName string) progressStatus {
	t.Helper()
	var (
		s        progressStatus
		failedAt sql.NullString
		lastErr  sql.NullString
	)
	if err := db.QueryRowContext(ctx, "SELECT status, failed_at, last_error FROM outbox_relay_progress WHERE relay_name = ?", relayName).
		Scan(&s.status, &failedAt, &lastErr); err != nil {
		t.Fatalf("read the progress row: %v", err)
	}
	s.failedAt, s.lastError = failedAt.Valid, lastErr.String
	return s
}

// wantFailed checks that the progress row says FAILED since a time, with a
// last error containing each of want.
func wantFailed(ctx context.Context, t *testing.T, db *sql.DB, relayName string, want ...string) {
	t.Helper()
	s := readProgressStatus(ctx, t, db, relayName)
	if s.status != checkpoint.StatusFailed || !s.failedAt {
		t.Fatalf("progress row: status %s, failed_at set %v; want FAILED with a time", s.status, s.failedAt)
	}
	for _, w := range want {
		if !strings.Contains(s.lastError, w) {
			t.Fatalf("progress row: last_error %q does not name %q", s.lastError, w)
		}
	}
}

// wantActive checks that the progress row is ACTIVE with no failed_at.
func wantActive(ctx context.Context, t *testing.T, db *sql.DB, relayName string) {
	t.Helper()
	if s := readProgressStatus(ctx, t, db, relayName); s.status != checkpoint.StatusActive || s.failedAt {
		t.Fatalf("progress row: status %s, failed_at set %v; want ACTIVE without failed_at", s.status, s.failedAt)
	}
}

// A relay in --mode binlog whose user lacks REPLICATION SLAVE stops at
// start, and the progress row says FAILED with the missing grant, although
// it never led. Once the grant is given, the next run's term delivers and
// clears it; another refusal, then `resume`, clears it too.
func TestStatusFailedOnGrantRefusalClearedByNextTermAndResume(t *testing.T) {
	t.Parallel()
	srv, db, b := privateSetup(t)
	ctx := testenv.WorkContext(t)
	root := srv.Root(t)
	for _, q := range []string{
		"CREATE USER 'relay'@'127.0.0.1' IDENTIFIED BY 'relay-secret'",
		"GRANT ALL ON `" + db.Name + "`.* TO 'relay'@'127.0.0.1'",
		"GRANT REPLICATION CLIENT ON *.* TO 'relay'@'127.0.0.1'",
	} {
		if _, err := root.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg := Config{MySQLDSN: "relay:relay-secret@tcp(" + srv.Addr() + ")/" + db.Name, AMQPURL: b.URL,
		DefaultExchange: b.Exchange, Mode: ModeBinlog, HeartbeatInterval: 500 * time.Millisecond}
	refused := func() {
		t.Helper()
		rr := runRelay(t, cfg, nil)
		select {
		case <-rr.done:
		case <-time.After(time.Minute):
			t.Fatal("a --mode binlog relay without REPLICATION SLAVE kept running")
		}
		var cfgErr *ConfigError
		if !errors.As(rr.err, &cfgErr) {
			t.Fatalf("Run returned %v, want a *ConfigError", rr.err)
		}
		rr.err = nil
		wantFailed(ctx, t, db.SQL, relayNameFor(db.Name), canal.CheckReplSlave)
	}
	refused()

	if _, err := root.ExecContext(ctx, "GRANT REPLICATION SLAVE ON *.* TO 'relay'@'127.0.0.1'"); err != nil {
		t.Fatal(err)
	}
	rr := runRelay(t, cfg, nil)
	waitFor(ctx, t, rr, "tailing", rr.r.Tailing)
	wantActive(ctx, t, db.SQL, relayNameFor(db.Name))
	if err := rr.stop(); err != nil {
		t.Fatal(err)
	}

	if _, err := root.ExecContext(ctx, "REVOKE REPLICATION SLAVE ON *.* FROM 'relay'@'127.0.0.1'"); err != nil {
		t.Fatal(err)
	}
	refused()
	if was, err := operator.Resume(ctx, db.SQL, relayNameFor(db.Name)); err != nil || was != checkpoint.StatusFailed {
		t.Fatalf("resume: was %q, %v; want FAILED", was, err)
	}
	wantActive(ctx, t, db.SQL, relayNameFor(db.Name))
}

// DDL on the outbox while the relay tails it (a required column renamed)
// stops binlog mode with a *canal.SchemaError; the leader marks the
// progress row FAILED naming the column before it exits.
func TestStatusFailedOnSchemaMismatch(t *testing.T) {
	t.Parallel()
	_, db, b := privateSetup(t)
	ctx := testenv.WorkContext(t)
	rr := runRelay(t, Config{MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, Mode: ModeBinlog,
		HeartbeatInterval: 500 * time.Millisecond}, nil)
	waitFor(ctx, t, rr, "tailing", rr.r.Tailing)
	for _, q := range []string{
		"ALTER TABLE outbox RENAME COLUMN routing_key TO rk",
		"INSERT INTO outbox (message_id, rk, payload) VALUES (UNHEX('aa'), 'k', 'p')",
	} {
		if _, err := db.SQL.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	select {
	case <-rr.done:
	case <-time.After(time.Minute):
		t.Fatal("the relay kept running after the outbox lost its routing_key column")
	}
	var se *canal.SchemaError
	if !errors.As(rr.err, &se) {
		t.Fatalf("Run returned %v, want a *canal.SchemaError", rr.err)
	}
	rr.err = nil
	wantFailed(ctx, t, db.SQL, relayNameFor(db.Name), "routing_key")
}

// Two instances of one relay name in --mode binlog with the same flags (so
// the same --server-id): the second finds the first's binlog dump registered
// under its id, and must stand by rather than refuse it as a clash; once the
// first stops, it leads and tails. (The relay's user here is root, which may
// list the server's replicas, so the clash check runs.)
func TestBinlogStandbySharesTheLeadersServerID(t *testing.T) {
	t.Parallel()
	srv, db, b := privateSetup(t)
	ctx := testenv.WorkContext(t)
	cfg := Config{MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, Mode: ModeBinlog,
		HeartbeatInterval: 500 * time.Millisecond, ServerID: testenv.ServerID(t)}
	first := runRelay(t, cfg, nil)
	root := srv.Root(t)
	waitFor(ctx, t, first, "the first instance's binlog dump registered under the server id", func() bool {
		rows, err := root.QueryContext(ctx, "SHOW SLAVE HOSTS")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			id := vals[0] // Server_id
			if b, ok := id.([]byte); ok {
				id = string(b)
			}
			if fmt.Sprint(id) == fmt.Sprint(cfg.ServerID) {
				return true
			}
		}
		return false
	})
	second := runRelay(t, cfg, nil)
	waitFor(ctx, t, second, "the second instance standing by", func() bool {
		var n int
		if err := db.SQL.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox_relay_instances WHERE role = 'standby'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, second, "the second instance tailing after the first stopped", second.r.Tailing)
}
