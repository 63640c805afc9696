package checkpoint_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// ackEnv is a migrated database with a progress row and a store on it.
type ackEnv struct {
	db    *testenv.DB
	pool  *sql.DB // opened as the relay opens its pool: parsed times in UTC
	store *checkpoint.Store
	epoch int64
}

func newAckEnv(ctx context.Context, t *testing.T) *ackEnv {
	t.Helper()
	db := testenv.MySQL(t)
	db.Migrate(ctx, t)
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ParseTime, cfg.Loc = true, time.UTC
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pool := sql.OpenDB(connector)
	t.Cleanup(func() { pool.Close() })
	store, err := checkpoint.New(pool, checkpoint.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &ackEnv{db: db, pool: pool, store: store, epoch: p.Epoch}
}

// insert writes n rows with payloads of the given size, 1,000 per
// statement, and returns them as the relay would have read them.
func (e *ackEnv) insert(ctx context.Context, t *testing.T, n, payload int) []*outbox.Record {
	t.Helper()
	body := []byte(strings.Repeat("p", payload))
	recs := make([]*outbox.Record, 0, n)
	for done := 0; done < n; {
		rows := min(1000, n-done)
		var q strings.Builder
		q.WriteString("INSERT INTO outbox (message_id, partition_key, routing_key, payload) VALUES ")
		args := make([]any, 0, 3*rows)
		batch := make([]*outbox.Record, rows)
		for i := range rows {
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteString("(?,?,'rk',?)")
			r := &outbox.Record{PartitionKey: fmt.Sprintf("k%d", (done+i)%7), RoutingKey: "rk",
				Payload: body, ContentType: "application/json", CreatedAt: time.Now().UTC()}
			if _, err := rand.Read(r.MessageID[:]); err != nil {
				t.Fatal(err)
			}
			args = append(args, r.MessageID[:], r.PartitionKey, body)
			batch[i] = r
		}
		res, err := e.db.SQL.ExecContext(ctx, q.String(), args...)
		if err != nil {
			t.Fatalf("insert %d rows: %v", rows, err)
		}
		// One multi-row INSERT gets consecutive ids from the first.
		first, err := res.LastInsertId()
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range batch {
			r.ID = uint64(first) + uint64(i)
		}
		recs = append(recs, batch...)
		done += rows
	}
	return recs
}

func idsOf(recs []*outbox.Record) []ordering.Range {
	ids := make([]uint64, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	return ordering.RangesOf(ids)
}

func (e *ackEnv) count(ctx context.Context, t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := e.db.SQL.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// A failed row whose reason is long and not ASCII — cut to the column's
// 1,024 bytes in the middle of a character, the server refuses the
// invalid UTF-8 under strict mode — is still acknowledged: it lands in
// outbox_failed with a valid reason, and the other rows are acknowledged
// with it.
func TestAckStoresFailedRowWithLongNonASCIIReason(t *testing.T) {
	for name, reason := range map[string]string{
		"umlaut": "x" + strings.Repeat("ü", 600), // 2-byte runes from an odd offset
		"cjk":    strings.Repeat("漢", 400),       // 3-byte runes; 1024 is not a multiple of 3
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testenv.Context(t, time.Minute)
			e := newAckEnv(ctx, t)
			recs := e.insert(ctx, t, 3, 10)
			pos := position.Position{Flavor: "mariadb", GTIDSet: "0-1-42"}
			err := e.store.Ack(ctx, e.epoch, checkpoint.Ack{Pos: pos, HasPos: true, Mode: "binlog", IDs: idsOf(recs), MessageIDs: midsOf(recs),
				Failed: []ordering.Failure{{Record: recs[1], Reason: reason}}})
			if err != nil {
				t.Fatalf("acknowledge 3 rows, one failed with a %d-byte reason: %v", len(reason), err)
			}
			if n := e.count(ctx, t, "SELECT COUNT(*) FROM outbox"); n != 0 {
				t.Fatalf("%d rows left in the outbox after their acknowledgement", n)
			}
			var stored string
			if err := e.db.SQL.QueryRowContext(ctx, "SELECT error FROM outbox_failed WHERE outbox_id = ?", recs[1].ID).Scan(&stored); err != nil {
				t.Fatalf("the failed row is not in outbox_failed: %v", err)
			}
			if !utf8.ValidString(stored) || stored == "" || !strings.HasPrefix(reason, stored) {
				t.Fatalf("stored reason %q (%d bytes): want a valid non-empty prefix of the reason", stored, len(stored))
			}
			p, err := e.store.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if p.Position.GTIDSet != pos.GTIDSet {
				t.Fatalf("stored position %q, want %q", p.Position.GTIDSet, pos.GTIDSet)
			}
		})
	}
}

// A failed row the server refuses whatever its reason (here headers that
// are not JSON, which outbox_failed's JSON column rejects) does not stop the
// acknowledgement, nor the other failed rows beside it: it is stored
// without its headers, with a plain-ASCII reason that says so.
func TestAckStoresUnstorableFailedRowWithoutBlockingOthers(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	e := newAckEnv(ctx, t)
	recs := e.insert(ctx, t, 3, 10)
	recs[0].Headers = []byte(`{"a":`)
	err := e.store.Ack(ctx, e.epoch, checkpoint.Ack{Mode: "binlog", IDs: idsOf(recs), MessageIDs: midsOf(recs), Failed: []ordering.Failure{
		{Record: recs[0], Reason: "bad outbox record: headers are not valid JSON: unexpected EOF"},
		{Record: recs[1], Reason: "returned: NO_ROUTE"},
	}})
	if err != nil {
		t.Fatalf("acknowledge with a failed row the server refuses: %v", err)
	}
	if n := e.count(ctx, t, "SELECT COUNT(*) FROM outbox"); n != 0 {
		t.Fatalf("%d rows left in the outbox after their acknowledgement", n)
	}
	rows, err := e.db.SQL.QueryContext(ctx, "SELECT outbox_id, headers IS NULL, error FROM outbox_failed ORDER BY outbox_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var id uint64
		var noHeaders bool
		var reason string
		if err := rows.Scan(&id, &noHeaders, &reason); err != nil {
			t.Fatal(err)
		}
		t.Logf("outbox_failed: outbox id %d, headers NULL %v: %s", id, noHeaders, reason)
		got = append(got, fmt.Sprintf("%d %v %v", id, noHeaders, strings.Contains(reason, "without its headers")))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("%d true true", recs[0].ID), fmt.Sprintf("%d true false", recs[1].ID)}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("outbox_failed holds %q, want %q (the unstorable row without headers and saying so, the other as it was)", got, want)
	}
}

// An acknowledgement repeated (a retry after a failure part of the way, or
// the same rows read again from the binlog after a crash) records a failed
// row in outbox_failed once.
func TestAckRecordsFailedRowOnce(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	e := newAckEnv(ctx, t)
	recs := e.insert(ctx, t, 2, 10)
	a := checkpoint.Ack{Mode: "binlog", IDs: idsOf(recs), MessageIDs: midsOf(recs), Failed: []ordering.Failure{{Record: recs[0], Reason: "returned: NO_ROUTE"}}}
	for i := range 2 {
		if err := e.store.Ack(ctx, e.epoch, a); err != nil {
			t.Fatalf("acknowledgement #%d: %v", i+1, err)
		}
	}
	if n := e.count(ctx, t, "SELECT COUNT(*) FROM outbox_failed WHERE outbox_id = ?", recs[0].ID); n != 1 {
		t.Fatalf("the failed row is %d times in outbox_failed, want once", n)
	}
}

// Acknowledging a large number of rows does not hold the progress row
// throughout: the leadership heartbeat, which updates that row with a
// timeout, gets through while the acknowledgement is under way (rows of it
// already deleted, others not yet). Holding the row for the whole delete
// made a transaction of 200,000 rows cost the leadership.
func TestAckLetsHeartbeatThroughMidway(t *testing.T) {
	const rows = 20_000
	ctx := testenv.WorkContext(t)
	e := newAckEnv(ctx, t)
	recs := e.insert(ctx, t, rows, 500)
	hb, err := e.db.SQL.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()

	var wg sync.WaitGroup
	ackDone := make(chan struct{})
	var ackErr error
	var ackTook time.Duration
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(ackDone)
		began := time.Now()
		ackErr = e.store.Ack(ctx, e.epoch, checkpoint.Ack{HasPos: true, Mode: "binlog", IDs: idsOf(recs), MessageIDs: midsOf(recs),
			Pos: position.Position{Flavor: "mariadb", GTIDSet: "0-1-7"}})
		ackTook = time.Since(began)
	}()
	var (
		beats, midway int
		longest       time.Duration
	)
	for done := false; !done; {
		select {
		case <-ackDone:
			done = true // one more beat after the end
		default:
		}
		began := time.Now()
		if _, err := hb.ExecContext(ctx, "UPDATE outbox_relay_progress SET leader_heartbeat = NOW(6) WHERE relay_name = 'default' AND epoch = ?", e.epoch); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		longest = max(longest, time.Since(began))
		beats++
		var left int
		if err := hb.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left > 0 && left < rows {
			midway++
		}
	}
	wg.Wait()
	if ackErr != nil {
		t.Fatalf("acknowledge %d rows: %v", rows, ackErr)
	}
	t.Logf("acknowledged %d rows of 500 bytes in %v; %d heartbeats, %d of them while it was under way; longest heartbeat %v",
		rows, ackTook.Round(time.Millisecond), beats, midway, longest.Round(time.Millisecond))
	if midway == 0 {
		t.Fatalf("no heartbeat got through while the acknowledgement of %d rows was under way: it holds the progress row throughout", rows)
	}
	if n := e.count(ctx, t, "SELECT COUNT(*) FROM outbox"); n != 0 {
		t.Fatalf("%d rows left after acknowledging all", n)
	}
}
