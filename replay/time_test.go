package replay

import (
	"context"
	"database/sql"
	"errors"
	"math/bits"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func flush(ctx context.Context, t *testing.T, db *sql.DB) {
	t.Helper()
	if _, err := db.ExecContext(ctx, "FLUSH BINARY LOGS"); err != nil {
		t.Fatal(err)
	}
}

// Transactions at known binlog event times, over several binlog files: each
// time range replays exactly the transactions whose event time lies in it,
// also when it begins and ends inside a file, and the file to start reading
// is found by a binary search over the files' start times.
func TestReplayTimeRange(t *testing.T) {
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	migrated(t, db)
	b := testenv.RabbitMQ(t)
	ctx := testenv.WorkContext(t)

	// Many files before the ones that matter: a search that read every
	// file's start would show in FilesProbed.
	for range 30 {
		flush(ctx, t, db.SQL)
	}
	// Each batch's event time is set with SET timestamp to a second the
	// server's clock has reached, after the flush that opened its file.
	nextSecond(ctx, t, db.SQL)
	flush(ctx, t, db.SQL)
	sA := serverSecond(ctx, t, db.SQL)
	w1 := commit(ctx, t, db.SQL, sA, batch("one", 10, "k1", "k2")...)
	nextSecond(ctx, t, db.SQL)
	flush(ctx, t, db.SQL)
	sB := serverSecond(ctx, t, db.SQL)
	w2 := commit(ctx, t, db.SQL, sB, batch("two", 10, "k1", "k2", "")...)
	s3 := nextSecond(ctx, t, db.SQL)
	w3 := commit(ctx, t, db.SQL, s3, batch("three", 6, "k1", "k3")...)
	if _, err := db.SQL.ExecContext(ctx, "CREATE TABLE other (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	w3 = append(w3, commit(ctx, t, db.SQL, s3, batch("three-b", 4, "k1")...)...)
	nextSecond(ctx, t, db.SQL)
	flush(ctx, t, db.SQL)
	sC := serverSecond(ctx, t, db.SQL)
	w4 := commit(ctx, t, db.SQL, sC, batch("four", 5, "k2")...)
	t.Logf("batches at %s, %s, %s, %s", sA.Format(time.TimeOnly), sB.Format(time.TimeOnly), s3.Format(time.TimeOnly), sC.Format(time.TimeOnly))

	// The search itself: about log2(34) files probed, not 34.
	tailer, err := canal.New(canal.Config{Host: db.Host, Port: db.Port, User: db.User, ServerID: testenv.ServerID(t),
		Schema: db.Name, Table: "outbox", Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	tp, err := tailer.TimePosition(ctx, db.SQL, s3)
	if err != nil {
		t.Fatal(err)
	}
	files, err := canal.BinaryLogs(ctx, db.SQL)
	if err != nil {
		t.Fatal(err)
	}
	if most := 2 + bits.Len(uint(len(files))); !tp.Found || !tp.Time.Equal(s3) || tp.FilesProbed > most {
		t.Fatalf("TimePosition(%s) = %+v; want found at %s after probing at most %d of the %d files", s3, tp, s3, most, len(files))
	}

	// A range inside one second, in the middle of a file, published.
	cfg := baseConfig(t, db, b)
	cfg.Range = Range{FromTime: s3, ToTime: s3}
	s, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("replay %s..%s: %v", s3, s3, err)
	}
	checkReplayed(t, drain(t, b.URL, b.Queue), w3, 0)
	if s.Messages != len(w3) || s.Confirmed != len(w3) || s.Transactions != 2 || !s.FromTime.Equal(s3) {
		t.Fatalf("summary %+v; want %d messages confirmed from 2 transactions at %s", s, len(w3), s3)
	}

	for _, c := range []struct {
		name     string
		from, to time.Time
		want     int
		txns     int
	}{
		{"across files", sB, sC, len(w2) + len(w3) + len(w4), 4},
		{"ends inside a file", sA, sB, len(w1) + len(w2), 2},
		{"from before the oldest binlog, nothing purged", time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC), time.Time{},
			len(w1) + len(w2) + len(w3) + len(w4), 5},
		{"sub-second times are cut to the second", s3.Add(900 * time.Millisecond), s3.Add(500 * time.Millisecond), len(w3), 2},
		{"after the last transaction", sC.Add(time.Hour), time.Time{}, 0, 0},
	} {
		cfg := baseConfig(t, db, b)
		cfg.DryRun = true
		cfg.Range = Range{FromTime: c.from, ToTime: c.to}
		s, err := Run(ctx, cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if s.Messages != c.want || s.Transactions != c.txns {
			t.Errorf("%s: dry run counts %d messages in %d transactions, want %d in %d", c.name, s.Messages, s.Transactions, c.want, c.txns)
		}
	}
	if n := len(drain(t, b.URL, b.Queue)); n != 0 {
		t.Fatalf("dry runs published %d messages", n)
	}
}

// A start the server has purged is refused with the oldest position it
// still has; a replay from that position works.
func TestReplayPurgedStartRefused(t *testing.T) {
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	migrated(t, db)
	b := testenv.RabbitMQ(t)
	ctx := testenv.Context(t, time.Minute)

	before := gtidPos(ctx, t, db.SQL)
	commit(ctx, t, db.SQL, time.Time{}, batch("purged", 5, "k1")...)
	srv.PurgeBinlogs(t)
	after := commit(ctx, t, db.SQL, time.Time{}, batch("kept", 5, "k1")...)
	var oldestFile, oldest string
	if err := db.SQL.QueryRowContext(ctx, "SHOW BINARY LOGS").Scan(&oldestFile, new(any)); err != nil {
		t.Fatal(err)
	}
	if err := db.SQL.QueryRowContext(ctx, "SELECT BINLOG_GTID_POS(?, 4)", oldestFile).Scan(&oldest); err != nil {
		t.Fatal(err)
	}

	for _, r := range []Range{{FromGTID: before}, {FromTime: time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)}} {
		cfg := baseConfig(t, db, b)
		cfg.Range = r
		s, err := Run(ctx, cfg)
		var re *RefusedError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), "oldest position available is "+oldest) || s != nil {
			t.Fatalf("replay %+v after the purge: %v (summary %v); want a refusal naming %s", r, err, s, oldest)
		}
		t.Logf("refused: %v", err)
	}

	cfg := baseConfig(t, db, b)
	cfg.Range = Range{FromGTID: oldest}
	if _, err := Run(ctx, cfg); err != nil {
		t.Fatalf("replay from the oldest position %s: %v", oldest, err)
	}
	checkReplayed(t, drain(t, b.URL, b.Queue), after, 0)
}

// A start that never existed on a server whose binlogs were never purged
// (a GTID of a server id or domain the server never logged) is refused
// before anything is read: no summary, and the message says the start is
// not in the server's history and gives the oldest and newest positions.
func TestReplayUnknownStartRefused(t *testing.T) {
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	migrated(t, db)
	b := testenv.RabbitMQ(t)
	ctx := testenv.Context(t, time.Minute)
	commit(ctx, t, db.SQL, time.Time{}, batch("real", 3, "k1")...)
	newest := gtidPos(ctx, t, db.SQL)

	for _, from := range []string{"0-4000000-7", "77-1-5"} {
		cfg := baseConfig(t, db, b)
		cfg.Range = Range{FromGTID: from}
		s, err := Run(ctx, cfg)
		var re *RefusedError
		if !errors.As(err, &re) || s != nil || !strings.Contains(err.Error(), "oldest position available is") ||
			!strings.Contains(err.Error(), "newest is "+newest) || strings.Contains(err.Error(), "handover") {
			t.Fatalf("replay from %s: %v (summary %v); want a refusal, without a summary, naming the oldest and the newest (%s) positions", from, err, s, newest)
		}
		t.Logf("refused: %v", err)
	}
	if n := len(drain(t, b.URL, b.Queue)); n != 0 {
		t.Fatalf("refused replays published %d messages", n)
	}
}
