package metrics_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// On a real MariaDB: the settings are read as the server applies them, and
// the server purges a rotated file no earlier than Headroom said, using the
// file's mtime and rotation as documented.
func TestRetentionHeadroomOnServer(t *testing.T) {
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.Root(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exec := func(q string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	read := func() metrics.BinlogRetention {
		t.Helper()
		r, err := metrics.ReadBinlogRetention(ctx, db)
		if err != nil {
			t.Fatalf("ReadBinlogRetention: %v", err)
		}
		return r
	}

	// Defaults of MariaDB 10.11: binlogs never expire.
	r := read()
	if r.Expiry != 0 || len(r.Files) == 0 {
		t.Fatalf("default retention %+v, want no expiry and some files", r)
	}
	if d := time.Since(r.Now); d < -5*time.Second || d > 5*time.Second {
		t.Errorf("server clock %v is %v away from ours", r.Now, d)
	}
	if h, err := metrics.RetentionHeadroom(ctx, db, r.Files[len(r.Files)-1], time.Time{}); err != nil || !math.IsInf(h, 1) {
		t.Errorf("headroom without expiry = %v, %v; want +Inf", h, err)
	}

	exec("SET GLOBAL expire_logs_days = 2")
	if r = read(); r.Expiry != 48*time.Hour {
		t.Errorf("expire_logs_days=2: expiry %v, want 48h", r.Expiry)
	}
	exec("SET GLOBAL binlog_expire_logs_seconds = 5400")
	if r = read(); r.Expiry != 90*time.Minute {
		t.Errorf("binlog_expire_logs_seconds=5400: expiry %v, want 1h30m", r.Expiry)
	}
	active := r.Files[len(r.Files)-1]
	if h, err := metrics.RetentionHeadroom(ctx, db, active, time.Time{}); err != nil || h != 5400 {
		t.Errorf("headroom of the active file = %v, %v; want 5400", h, err)
	}

	// File A: written now, then rotated.
	const expiry = 3
	exec("SET GLOBAL binlog_expire_logs_seconds = 3")
	r = read()
	fileA, writtenAt := r.Files[len(r.Files)-1], r.Now
	exec("CREATE DATABASE retention_probe")
	exec("CREATE TABLE retention_probe.t (id INT PRIMARY KEY)")
	exec("INSERT INTO retention_probe.t VALUES (1)")
	exec("FLUSH BINARY LOGS")
	r = read()
	if r.Files[len(r.Files)-1] == fileA {
		t.Fatalf("FLUSH BINARY LOGS did not rotate %s", fileA)
	}
	h, err := r.Headroom(fileA, writtenAt)
	if err != nil || h <= 0 || h > expiry {
		t.Fatalf("headroom of the just rotated %s = %v, %v; want in (0, %d]", fileA, h, err, expiry)
	}
	st, err := os.Stat(filepath.Join(srv.Dir(), "data", fileA))
	if err != nil {
		t.Fatalf("stat %s: %v", fileA, err)
	}
	// The server compares whole seconds of mtime: allow one.
	truth := st.ModTime().Add(expiry * time.Second).Sub(r.Now).Seconds()
	if h > truth+1 {
		t.Errorf("headroom %.3fs overstates: by the file's mtime it is %.3fs", h, truth)
	}
	t.Logf("%s: headroom %.3fs (lower bound), by mtime %.3fs", fileA, h, truth)

	// Rotating before the deadline purges nothing.
	exec("FLUSH BINARY LOGS")
	if r = read(); !slices.Contains(r.Files, fileA) {
		t.Fatalf("%s purged %.3fs before its expiry: %v", fileA, truth, r.Files)
	}

	// After the deadline, the next rotation purges it (once InnoDB's binlog
	// checkpoint has passed it: retry the rotation for a while).
	deadline := st.ModTime().Add((expiry + 1) * time.Second)
	time.Sleep(time.Until(deadline))
	m, _ := metrics.New(nil)
	for i := 0; ; i++ {
		exec("FLUSH BINARY LOGS")
		_, err := m.UpdateRetentionHeadroom(ctx, db, fileA, writtenAt)
		if errors.Is(err, metrics.ErrBinlogPurged) {
			break
		}
		if i == 50 {
			t.Fatalf("%s not purged %v after its expiry: %v", fileA, time.Since(deadline), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	h, err = metrics.RetentionHeadroom(ctx, db, fileA, writtenAt)
	if h != 0 || !errors.Is(err, metrics.ErrBinlogPurged) {
		t.Errorf("headroom of purged %s = %v, %v; want 0 and ErrBinlogPurged", fileA, h, err)
	}

	// A name from another server is unknown, and the gauge says so.
	if h, err := m.UpdateRetentionHeadroom(ctx, db, "mysql-bin.000001", time.Now()); !math.IsNaN(h) || !errors.Is(err, metrics.ErrHeadroomUnknown) {
		t.Errorf("headroom of another server's file = %v, %v; want NaN and ErrHeadroomUnknown", h, err)
	}

	// A server without binlog access: a wrapped error, NaN.
	closed, err := sql.Open("mysql", srv.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	if h, err := metrics.RetentionHeadroom(ctx, closed, active, time.Time{}); err == nil || !math.IsNaN(h) {
		t.Errorf("headroom on a closed pool = %v, %v; want NaN and an error", h, err)
	}
}
