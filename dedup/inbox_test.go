package dedup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/dedup"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// Process runs the handler once per (consumer, message): a second call is a
// duplicate, another consumer is not.
func TestProcessRunsOnceAndSkipsDuplicates(t *testing.T) {
	db := schemaDB(t).SQL
	ctx := testenv.Context(t, time.Minute)
	id := newIDs(t, 1)[0]
	var runs calls
	handler := func(ctx context.Context, tx *sql.Tx) error {
		runs.add(id)
		return effect(ctx, tx, id)
	}

	billing := dedup.New(db, "billing")
	if done, err := billing.Process(ctx, id, "order.placed", handler); !done || err != nil {
		t.Fatalf("first Process: done %v, err %v; want true, nil", done, err)
	}
	if done, err := billing.Process(ctx, id, "order.placed", handler); done || err != nil {
		t.Fatalf("second Process: done %v, err %v; want false, nil", done, err)
	}
	if n := runs.get(id); n != 1 {
		t.Fatalf("handler ran %d times for one consumer, want 1", n)
	}
	// Another service sharing the database processes it for itself.
	if done, err := dedup.New(db, "shipping").Process(ctx, id, "order.placed", handler); !done || err != nil {
		t.Fatalf("other consumer: done %v, err %v; want true, nil", done, err)
	}
	if got := effectCounts(t, db)[id]; got != 2 {
		t.Fatalf("%d effects, want 2 (one per consumer)", got)
	}

	u := uuid.MustParse(id)
	rows, err := db.QueryContext(ctx, "SELECT consumer, message_name FROM message_deduplication WHERE message_id = ? ORDER BY consumer", u[:])
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var consumer, name string
		if err := rows.Scan(&consumer, &name); err != nil {
			t.Fatal(err)
		}
		got = append(got, consumer+" "+name)
	}
	if strings.Join(got, ", ") != "billing order.placed, shipping order.placed" {
		t.Fatalf("records %v", got)
	}
}

// A handler error rolls back the handler's writes and records nothing; the
// message is processed by the next call.
func TestProcessHandlerErrorRecordsNothing(t *testing.T) {
	db := schemaDB(t).SQL
	ctx := testenv.Context(t, time.Minute)
	inbox := dedup.New(db, "billing")
	id := newIDs(t, 1)[0]
	boom := errors.New("payment service down")

	done, err := inbox.Process(ctx, id, "order.placed", func(ctx context.Context, tx *sql.Tx) error {
		if err := effect(ctx, tx, id); err != nil {
			return err
		}
		return boom
	})
	if done || !errors.Is(err, boom) || !strings.Contains(err.Error(), id) {
		t.Fatalf("failing handler: done %v, err %v; want false and an error wrapping the handler's, naming the message", done, err)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM effects"); n != 0 {
		t.Fatalf("%d effects after a failed handler, want 0", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM message_deduplication"); n != 0 {
		t.Fatalf("%d records after a failed handler, want 0", n)
	}
	done, err = inbox.Process(ctx, id, "order.placed", func(ctx context.Context, tx *sql.Tx) error { return effect(ctx, tx, id) })
	if !done || err != nil {
		t.Fatalf("retry: done %v, err %v; want true, nil", done, err)
	}
	if got := effectCounts(t, db)[id]; got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
}

// Ids that are not UUIDs, and names the columns cannot hold, are refused
// before anything touches the database (the inbox here has none).
func TestProcessRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	inbox := dedup.New(nil, "billing")
	never := func(context.Context, *sql.Tx) error {
		t.Error("handler ran")
		return nil
	}
	for _, id := range []string{"", "42", "not-a-uuid", "0190f0e0a1b27c3d8e4f5a6b7c8d9e01",
		"{0190f0e0-a1b2-7c3d-8e4f-5a6b7c8d9e01}", "0190f0e0-a1b2-7c3d-8e4f-5a6b7c8d9e0g"} {
		done, err := inbox.Process(ctx, id, "order.placed", never)
		if done || !errors.Is(err, dedup.ErrInvalidMessageID) || !strings.Contains(err.Error(), `"billing"`) {
			t.Errorf("id %q: done %v, err %v; want ErrInvalidMessageID naming the consumer", id, done, err)
		}
	}
	id := "0190f0e0-a1b2-7c3d-8e4f-5a6b7c8d9e01"
	if _, err := inbox.Process(ctx, id, strings.Repeat("é", 256), never); !errors.Is(err, dedup.ErrInvalidName) {
		t.Errorf("256-character message name: err %v, want ErrInvalidName", err)
	}
	if _, err := inbox.Process(ctx, id, "bad\xff", never); !errors.Is(err, dedup.ErrInvalidName) {
		t.Errorf("invalid UTF-8 message name: err %v, want ErrInvalidName", err)
	}
	if _, err := dedup.New(nil, strings.Repeat("c", 256)).Process(ctx, id, "x", never); !errors.Is(err, dedup.ErrInvalidName) {
		t.Errorf("256-character consumer name: err %v, want ErrInvalidName", err)
	}
}

// processed_at is UTC whatever the session's time zone.
func TestProcessRecordsUTC(t *testing.T) {
	tdb := schemaDB(t)
	cfg, err := mysql.ParseDSN(tdb.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+05:00'"
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := testenv.Context(t, time.Minute)
	id := newIDs(t, 1)[0]
	if done, err := dedup.New(db, "billing").Process(ctx, id, "t", func(context.Context, *sql.Tx) error { return nil }); !done || err != nil {
		t.Fatalf("done %v, err %v", done, err)
	}
	var at string
	if err := db.QueryRowContext(ctx, "SELECT processed_at FROM message_deduplication").Scan(&at); err != nil {
		t.Fatal(err)
	}
	got, err := time.Parse("2006-01-02 15:04:05.999999", at)
	if err != nil {
		t.Fatal(err)
	}
	// Five hours is the difference being tested; an hour of slack says
	// nothing about speed.
	if d := time.Since(got); d < -time.Hour || d > time.Hour {
		t.Fatalf("processed_at %s is %s from now (UTC): not written in UTC", at, d)
	}
}

// isolationLevels are the levels the once-only guarantee is tested under.
var isolationLevels = []struct {
	name  string
	level sql.IsolationLevel
}{{"ReadCommitted", sql.LevelReadCommitted}, {"RepeatableRead", sql.LevelRepeatableRead}}

// awaitWaiters waits until n sessions of the test's database are inside
// their INSERT of an inbox record, which can only be waiting on the lock the
// caller's transaction holds; after 30 s it returns an error listing the
// sessions. (The server's PROCESSLIST is the reliable view here:
// INNODB_TRX has been seen to leave one of several waiters out.)
func awaitWaiters(ctx context.Context, db *sql.DB, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND INFO LIKE 'INSERT INTO message_deduplication%'`).Scan(&waiting); err != nil {
			return err
		}
		if waiting == n {
			return nil
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			rows, err := db.QueryContext(ctx, `SELECT ID, COMMAND, TIME, COALESCE(STATE, ''), COALESCE(LEFT(INFO, 60), '')
				FROM information_schema.PROCESSLIST WHERE DB = DATABASE()`)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id, cmd, tm, state, info string
				if err := rows.Scan(&id, &cmd, &tm, &state, &info); err != nil {
					return err
				}
				fmt.Fprintf(&b, "\n\tthread %s %s %ss %q %q", id, cmd, tm, state, info)
			}
			return fmt.Errorf("%d sessions inserting the record after 30 s, want %d:%s", waiting, n, b.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Concurrent deliveries of one message: the first holds the record's key
// while its handler runs; the others wait on it (the handler goes on only
// once all of them are seen waiting) and, when it commits, get done ==
// false without running their handler. When it rolls back instead, exactly
// one of the waiters runs its handler.
func TestProcessConcurrentDeliveriesWaitForTheFirst(t *testing.T) {
	const callers = 8
	for _, iso := range isolationLevels {
		for _, firstFails := range []bool{false, true} {
			name := iso.name + "/FirstCommits"
			if firstFails {
				name = iso.name + "/FirstRollsBack"
			}
			t.Run(name, func(t *testing.T) {
				db := schemaDB(t).SQL
				ctx := testenv.Context(t, time.Minute)
				inbox := dedup.New(db, "billing").WithIsolation(iso.level)
				id := newIDs(t, 1)[0]
				boom := errors.New("first handler fails")
				var runs atomic.Int32
				handler := func(ctx context.Context, tx *sql.Tx) error {
					if err := effect(ctx, tx, id); err != nil {
						return err
					}
					if runs.Add(1) > 1 {
						return nil
					}
					// The first: hold the key until every other caller waits on it.
					if err := awaitWaiters(ctx, db, callers-1); err != nil {
						return err
					}
					if firstFails {
						return boom
					}
					return nil
				}
				var wg sync.WaitGroup
				var doneN, dupN, boomN, otherErrN atomic.Int32
				for range callers {
					wg.Go(func() {
						done, err := inbox.Process(ctx, id, "order.placed", handler)
						switch {
						case errors.Is(err, boom):
							boomN.Add(1)
						case err != nil:
							otherErrN.Add(1)
							t.Errorf("Process: %v", err)
						case done:
							doneN.Add(1)
						default:
							dupN.Add(1)
						}
					})
				}
				wg.Wait()
				wantRuns, wantBoom := int32(1), int32(0)
				if firstFails {
					wantRuns, wantBoom = 2, 1
				}
				if doneN.Load() != 1 || dupN.Load() != callers-1-wantBoom || boomN.Load() != wantBoom || runs.Load() != wantRuns {
					t.Fatalf("done %d, duplicates %d, handler errors %d, other errors %d, handler runs %d; want 1, %d, %d, 0, %d",
						doneN.Load(), dupN.Load(), boomN.Load(), otherErrN.Load(), runs.Load(), callers-1-wantBoom, wantBoom, wantRuns)
				}
				if got := effectCounts(t, db)[id]; got != 1 {
					t.Fatalf("%d effects committed, want 1", got)
				}
			})
		}
	}
}

// Many goroutines process the same messages at once, in different orders,
// with handlers that fail now and then (the caller retries until the call
// succeeds, as a redelivery would): every message has exactly one effect,
// and exactly one call per message reports done.
func TestProcessManyGoroutinesOneEffectEach(t *testing.T) {
	const (
		goroutines = 16
		messages   = 100
	)
	for _, iso := range isolationLevels {
		t.Run(iso.name, func(t *testing.T) {
			db := schemaDB(t).SQL
			ctx := testenv.WorkContext(t)
			inbox := dedup.New(db, "billing").WithIsolation(iso.level)
			ids := newIDs(t, messages)
			var doneN, dupN, failures atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := range goroutines {
				wg.Go(func() {
					order := rand.Perm(messages)
					<-start
					for _, i := range order {
						id := ids[i]
						for attempt := 0; ; attempt++ {
							done, err := inbox.Process(ctx, id, "order.placed", func(ctx context.Context, tx *sql.Tx) error {
								if err := effect(ctx, tx, id); err != nil {
									return err
								}
								if flaky(g, id, attempt) {
									return errFlaky
								}
								return nil
							})
							if err == nil {
								if done {
									doneN.Add(1)
								} else {
									dupN.Add(1)
								}
								break
							}
							if !errors.Is(err, errFlaky) {
								t.Errorf("Process %s: %v", id, err)
								return
							}
							failures.Add(1)
						}
					}
				})
			}
			close(start)
			wg.Wait()
			counts := effectCounts(t, db)
			for _, id := range ids {
				if counts[id] != 1 {
					t.Errorf("message %s: %d effects, want 1", id, counts[id])
				}
			}
			if len(counts) != messages || doneN.Load() != messages || dupN.Load() != goroutines*messages-messages {
				t.Fatalf("%d messages with effects, %d done, %d duplicates; want %d, %d, %d",
					len(counts), doneN.Load(), dupN.Load(), messages, messages, goroutines*messages-messages)
			}
			t.Logf("%s: %d calls: %d done, %d duplicates, %d handler failures retried",
				iso.name, goroutines*messages, doneN.Load(), dupN.Load(), failures.Load())
		})
	}
}

var errFlaky = errors.New("flaky handler")

// flaky decides, the same way every run, whether goroutine g's attempt at
// id fails: about one first attempt in four, never a third.
func flaky(g int, id string, attempt int) bool {
	if attempt >= 2 {
		return false
	}
	h := fnv.New32a()
	h.Write([]byte{byte(g), byte(attempt)})
	h.Write([]byte(id))
	return h.Sum32()%4 == 0
}
