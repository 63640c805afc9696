package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// replicaCatchUpTimeout bounds WaitReplicaCaughtUp.
const replicaCatchUpTimeout = 60 * time.Second

// adminTimeout bounds one administrative statement of the harness.
const adminTimeout = 30 * time.Second

// PurgeBinlogs rotates the binlog (FLUSH BINARY LOGS) and purges every file
// but the newest, so positions before the call are no longer readable. It
// fails the test when a file cannot be purged, e.g. because a connected binlog
// reader is still using it.
func (s *Server) PurgeBinlogs(t testing.TB) {
	t.Helper()
	s.mustBeOwn(t, "PurgeBinlogs")
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	db := s.adminDB(t)
	defer db.Close()
	if _, err := db.ExecContext(ctx, "FLUSH BINARY LOGS"); err != nil {
		t.Fatalf("testenv: flush binary logs on %s: %v", s.Addr(), err)
	}
	files, err := binlogFiles(ctx, db)
	if err != nil {
		t.Fatalf("testenv: purge binary logs on %s: %v", s.Addr(), err)
	}
	newest := files[len(files)-1]
	purge := "PURGE BINARY LOGS TO '" + strings.ReplaceAll(newest, "'", "''") + "'"
	// PURGE silently keeps a file until InnoDB has made its transactions
	// durable (the binlog checkpoint, up to a second with
	// innodb_flush_log_at_trx_commit=2), so repeat it until only newest is left.
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if _, err := db.ExecContext(ctx, purge); err != nil {
			t.Fatalf("testenv: purge binary logs to %s on %s: %v", newest, s.Addr(), err)
		}
		if files, err = binlogFiles(ctx, db); err != nil {
			t.Fatalf("testenv: purge binary logs on %s: %v", s.Addr(), err)
		}
		if len(files) == 1 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: purge binary logs to %s on %s: after %v still there: %v (a connected binlog reader holding them?)",
				newest, s.Addr(), adminTimeout, files)
		case <-tick.C:
		}
	}
}

// binlogFiles lists SHOW BINARY LOGS, oldest first.
func binlogFiles(ctx context.Context, db *sql.DB) ([]string, error) {
	rows, err := db.QueryContext(ctx, "SHOW BINARY LOGS")
	if err != nil {
		return nil, fmt.Errorf("show binary logs: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("show binary logs: %w", err)
	}
	var files []string
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, fmt.Errorf("show binary logs: %w", err)
		}
		files = append(files, string(vals[0]))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("show binary logs: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("show binary logs: no binlog files (is the binlog on?)")
	}
	return files, nil
}

// StartReplica starts a new private server (same options as s, another server
// id) replicating from s with GTID (MASTER_USE_GTID=slave_pos) from the start of
// s's binlog, and returns once it has caught up with s. The replica has
// read_only=ON and log-slave-updates, so after Promote it serves the
// replicated transactions to binlog readers. s's binlogs must not have been
// purged. The replica is stopped at cleanup.
func (s *Server) StartReplica(t testing.TB) *Server {
	t.Helper()
	opts := s.opts
	opts.ServerID = randomServerID()
	for opts.ServerID == s.serverID {
		opts.ServerID = randomServerID()
	}
	r := StartServer(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	db := r.adminDB(t)
	defer db.Close()
	stmt := fmt.Sprintf("CHANGE MASTER TO MASTER_HOST='%s', MASTER_PORT=%d, MASTER_USER='root', MASTER_PASSWORD='', "+
		"MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1; SET GLOBAL read_only=ON; START SLAVE",
		s.Host(), s.Port())
	if _, err := db.ExecContext(ctx, stmt); err != nil {
		t.Fatalf("testenv: set up replica %s of %s: %v", r.Addr(), s.Addr(), err)
	}
	s.WaitReplicaCaughtUp(t, r)
	return r
}

// WaitReplicaCaughtUp waits until replica's gtid_slave_pos covers s's
// gtid_binlog_pos as read at the call. It polls with MASTER_GTID_WAIT and fails
// the test at once on a replication error, or after a bounded time.
func (s *Server) WaitReplicaCaughtUp(t testing.TB, replica *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), replicaCatchUpTimeout)
	defer cancel()
	sdb := s.adminDB(t)
	defer sdb.Close()
	var target string
	if err := sdb.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_binlog_pos").Scan(&target); err != nil {
		t.Fatalf("testenv: read gtid_binlog_pos of %s: %v", s.Addr(), err)
	}
	rdb := replica.adminDB(t)
	defer rdb.Close()
	for {
		var res int
		// Waits server-side up to 0.5 s for the position: 0 reached, -1 not yet.
		if err := rdb.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, 0.5)", target).Scan(&res); err != nil {
			t.Fatalf("testenv: replica %s waiting for %q of %s: %v", replica.Addr(), target, s.Addr(), err)
		}
		if res == 0 {
			return
		}
		if msg := replicationError(ctx, rdb); msg != "" {
			t.Fatalf("testenv: replica %s of %s: %s", replica.Addr(), s.Addr(), msg)
		}
		if ctx.Err() != nil {
			var have string
			_ = rdb.QueryRow("SELECT @@GLOBAL.gtid_slave_pos").Scan(&have)
			t.Fatalf("testenv: replica %s did not reach %q of %s within %v (gtid_slave_pos %q)",
				replica.Addr(), target, s.Addr(), replicaCatchUpTimeout, have)
		}
	}
}

// replicationError returns the last IO or SQL error of SHOW SLAVE STATUS, or "".
func replicationError(ctx context.Context, db *sql.DB) string {
	rows, err := db.QueryContext(ctx, "SHOW SLAVE STATUS")
	if err != nil {
		return ""
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil || !rows.Next() {
		return ""
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return ""
	}
	var msgs []string
	for i, c := range cols {
		if (c == "Last_IO_Error" || c == "Last_SQL_Error") && vals[i].String != "" {
			msgs = append(msgs, c+": "+vals[i].String)
		}
	}
	return strings.Join(msgs, "; ")
}

// Promote turns a replica into a primary: STOP SLAVE; RESET SLAVE ALL;
// SET GLOBAL read_only=OFF.
func (s *Server) Promote(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	db := s.adminDB(t)
	defer db.Close()
	if _, err := db.ExecContext(ctx, "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only=OFF"); err != nil {
		t.Fatalf("testenv: promote %s: %v", s.Addr(), err)
	}
}

// adminDB is a root pool for one harness operation; the caller closes it. It
// is opened per operation because the server may have been restarted since
// the last one.
func (s *Server) adminDB(t testing.TB) *sql.DB {
	t.Helper()
	connector, err := mysql.NewConnector(s.config(""))
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", s.Addr(), err)
	}
	return sql.OpenDB(connector)
}
