package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// This file tests what the binlog cannot give as committed outbox rows:
// schema changes of the outbox table, statement-logged writes, XA
// transactions. Each runs under a steady load checked by the validator.

// steadyLoad is a producer load that runs until stop: 2 producers over 20
// partitions, a transaction every 5 ms each.
type steadyLoad struct {
	until chan struct{}
	done  chan error
	once  sync.Once
}

func startLoad(ctx context.Context, db *testenv.DB, b *testenv.Broker, v *validator.Validator, offset int) *steadyLoad {
	l := &steadyLoad{until: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		l.done <- testload.Run(ctx, db.SQL, v, testload.Load{
			Producers: 2, Partitions: 20, Total: 100, BigTxn: 5, BigShare: 0.1, Exchange: b.Exchange,
			PartitionOffset: offset, Pace: 5 * time.Millisecond, Until: l.until,
		})
	}()
	return l
}

// stop ends the load and fails the test if a producer failed.
func (l *steadyLoad) stop(t *testing.T) {
	t.Helper()
	l.once.Do(func() { close(l.until) })
	if err := <-l.done; err != nil {
		t.Fatalf("load: %v", err)
	}
	l.done <- nil
}

// oddRows writes messages one per transaction on conn with the column
// list cols (message_type's column as the table names it now), in
// partitions odd-0..odd-2, and tells v.
type oddRows struct {
	b   *testenv.Broker
	v   *validator.Validator
	seq int
}

func (o *oddRows) write(ctx context.Context, t *testing.T, ex outbox.Execer, typeCol string, n int) {
	t.Helper()
	for range n {
		var id outbox.MessageID
		copy(id[:], fmt.Sprintf("odd-%012d", o.seq))
		pk := fmt.Sprintf("odd-%d", o.seq%3)
		payload := []byte(fmt.Sprintf("{\"odd\":%d}", o.seq))
		q := "INSERT INTO outbox (message_id, partition_key, exchange, routing_key, " + typeCol + ", payload) VALUES (?, ?, ?, ?, ?, ?)"
		if _, err := ex.ExecContext(ctx, q, id[:], pk, o.b.Exchange, "rk."+pk, "odd.event", payload); err != nil {
			t.Fatalf("write odd row %d: %v", o.seq, err)
		}
		o.v.Expect(validator.Expected{ID: id, PartitionKey: pk, Exchange: o.b.Exchange, RoutingKey: "rk." + pk,
			MessageType: "odd.event", Payload: payload})
		o.seq++
	}
}

// exec runs statements on db, failing the test on the first error.
func exec(ctx context.Context, t *testing.T, ex outbox.Execer, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := ex.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// settle waits until the validator has every message expected so far.
func settle(ctx context.Context, t *testing.T, v *validator.Validator) {
	t.Helper()
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
}

// The DDL a DBA or a migration tool runs on the outbox table while an auto
// relay delivers under load: added and dropped columns and indexes, widened
// and narrowed types, reordered columns keep binlog mode; a contract column
// renamed away (rows written meanwhile) and back sends it to poll mode,
// which waits for the name, delivers, and hands over back to the binlog,
// without a restart. Every row once, in order per key.
func TestSchemaChangesUnderLoadAuto(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	v := consume(t, b, b.Queue)
	ctx := testenv.WorkContext(t)
	m := newModes()
	rr := runRelay(t, Config{MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, CheckpointInterval: time.Second,
		OnMode: m.hook, BinlogRetryInterval: 300 * time.Millisecond, PollInterval: 50 * time.Millisecond}, nil)
	m.wait(ctx, t, ModeBinlog)
	odd := &oddRows{b: b, v: v}

	load := startLoad(ctx, db, b, v, 0)
	for _, ddl := range []string{
		"ALTER TABLE outbox ADD COLUMN tenant INT NULL",
		"ALTER TABLE outbox ADD INDEX idx_tenant (tenant)",
		"ALTER TABLE outbox DROP INDEX idx_tenant",
		"ALTER TABLE outbox DROP COLUMN tenant",
		"ALTER TABLE outbox MODIFY routing_key VARCHAR(512) NOT NULL",
		"ALTER TABLE outbox MODIFY payload MEDIUMBLOB NOT NULL",
		"ALTER TABLE outbox MODIFY message_type VARCHAR(255) NOT NULL AFTER id",
	} {
		exec(ctx, t, db.SQL, ddl)
		odd.write(ctx, t, db.SQL, "message_type", 3)
		waitReceived(ctx, t, v, v.Received()+100) // the load flows across each change
	}
	load.stop(t)
	settle(ctx, t, v)
	if seen := m.modesSeen(); strings.Contains(seen, string(ModePoll)) {
		t.Fatalf("modes %s: ADD/DROP COLUMN, INDEX, wider types and reordered columns must keep binlog mode", seen)
	}

	// A contract column renamed away, 10 rows written meanwhile, renamed back.
	exec(ctx, t, db.SQL, "ALTER TABLE outbox CHANGE message_type acc_msg_type VARCHAR(255) NOT NULL")
	odd.write(ctx, t, db.SQL, "acc_msg_type", 10)
	m.wait(ctx, t, ModePoll)
	waitFor(ctx, t, rr, "waiting for the column, in status", func() bool {
		st := readStatus(ctx, t, db.SQL, relayNameFor(db.Name))
		return strings.Contains(st.ModeReason, "poll mode waits for the relay's tables") && strings.Contains(st.ModeReason, `"message_type"`)
	})
	if n := v.Received(); v.Missing() != 10 {
		t.Fatalf("%d deliveries, %d missing while the column is renamed: want exactly the 10 rows written meanwhile missing", n, v.Missing())
	}
	exec(ctx, t, db.SQL, "ALTER TABLE outbox CHANGE acc_msg_type message_type VARCHAR(255) NOT NULL")
	load = startLoad(ctx, db, b, v, 20)
	m.wait(ctx, t, ModeBinlog)
	odd.write(ctx, t, db.SQL, "message_type", 5)
	load.stop(t)
	settle(ctx, t, v)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rr.done:
		t.Fatalf("the relay stopped: %v", rr.err)
	default:
	}
}

// readStatus is the relay name's status row.
func readStatus(ctx context.Context, t *testing.T, db *sql.DB, name string) operator.RelayStatus {
	t.Helper()
	rows, err := operator.ReadStatus(ctx, db, name, time.Minute)
	if err != nil || len(rows) != 1 {
		t.Fatalf("status of %q: %v (%d rows)", name, err, len(rows))
	}
	return rows[0]
}

// runUntilExit runs a relay with cfg and returns Run's error once it
// returns by itself (progress.Patience at most).
func runUntilExit(t *testing.T, cfg Config) error {
	t.Helper()
	return exitErr(t, runRelay(t, cfg, nil), "the relay did not stop by itself")
}

// exitErr waits (progress.Patience at most, else fails with why) until
// rr's Run returns by itself, and takes its error: expected, so not the
// cleanup's failure.
func exitErr(t *testing.T, rr *relayRun, why string) error {
	t.Helper()
	select {
	case <-rr.done:
		err := rr.err
		rr.err = nil
		return err
	case <-time.After(progress.Patience):
		t.Fatalf("%s within %v", why, progress.Patience)
		return nil
	}
}

// In binlog mode the same rename stops the relay with status FAILED naming
// the column, the table map's columns, the transaction and the way out; a
// restart in binlog mode refuses the same way; a run in auto mode delivers
// the rows and returns to the binlog past them, after which binlog mode
// goes on.
func TestSchemaChangeBinlogModeFails(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	v := consume(t, b, b.Queue)
	ctx := testenv.WorkContext(t)
	cfg := Config{MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, CheckpointInterval: time.Second,
		Mode: ModeBinlog, PollInterval: 50 * time.Millisecond, BinlogRetryInterval: 300 * time.Millisecond}
	rr := runRelay(t, cfg, nil)
	waitFor(ctx, t, rr, "tailing", rr.r.Tailing)
	odd := &oddRows{b: b, v: v}
	load := startLoad(ctx, db, b, v, 0)
	odd.write(ctx, t, db.SQL, "message_type", 5)
	load.stop(t)
	// A checkpoint stored before the rename: a term that ends meanwhile (a
	// busy machine's lost lease) resumes from it and reads the rename from
	// the binlog, instead of a first start whose polling sweep would
	// deliver the rows by name and never see the table map.
	waitFor(ctx, t, rr, "a stored checkpoint", func() bool {
		var set sql.NullString
		err := db.SQL.QueryRowContext(ctx, "SELECT gtid_set FROM outbox_relay_progress WHERE relay_name = ?", relayNameFor(db.Name)).Scan(&set)
		return err == nil && set.Valid && set.String != ""
	})
	exec(ctx, t, db.SQL, "ALTER TABLE outbox CHANGE message_type acc_msg_type VARCHAR(255) NOT NULL")
	odd.write(ctx, t, db.SQL, "acc_msg_type", 5)
	exec(ctx, t, db.SQL, "ALTER TABLE outbox CHANGE acc_msg_type message_type VARCHAR(255) NOT NULL")
	odd.write(ctx, t, db.SQL, "message_type", 5)

	first := exitErr(t, rr, "binlog mode went on past a table map without message_type")
	checkRefusal := func(err error) {
		t.Helper()
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Fatalf("Run returned %v, want a *ConfigError (exit 2)", err)
		}
		for _, want := range []string{`"message_type"`, "acc_msg_type", "in transaction 0-", "Config.Mode auto"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("the refusal does not say %s: %v", want, err)
			}
		}
	}
	checkRefusal(first)
	if st := readStatus(ctx, t, db.SQL, relayNameFor(db.Name)); st.Status != "FAILED" || !strings.Contains(st.LastError, "acc_msg_type") {
		t.Fatalf("status %s (%s), want FAILED naming the table map", st.Status, st.LastError)
	}
	again := runUntilExit(t, cfg)
	checkRefusal(again)
	if again.Error() != first.Error() {
		t.Fatalf("a restart says\n  %v\nthe first stop said\n  %v", again, first)
	}

	// The way out: auto mode delivers them and returns to the binlog.
	auto := cfg
	auto.Mode = ModeAuto
	m := newModes()
	auto.OnMode = m.hook
	ar := runRelay(t, auto, nil)
	m.wait(ctx, t, ModePoll)
	m.wait(ctx, t, ModeBinlog)
	settle(ctx, t, v)
	if err := ar.stop(); err != nil {
		t.Fatal(err)
	}
	// Binlog mode goes on from there.
	br := runRelay(t, cfg, nil)
	waitFor(ctx, t, br, "tailing", br.r.Tailing)
	odd.write(ctx, t, db.SQL, "message_type", 5)
	settle(ctx, t, v)
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
}

// TRUNCATE outbox while rows are in flight: the relay goes on, publishes
// nothing twice, and delivers what is written after.
func TestTruncateWhileInFlight(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	v := consume(t, b, b.Queue)
	ctx := testenv.WorkContext(t)
	rr := runRelay(t, Config{MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, CheckpointInterval: time.Second}, nil)
	waitFor(ctx, t, rr, "tailing", rr.r.Tailing)
	before := validator.New() // what is written before the TRUNCATE: each at most once
	testload.Produce(ctx, t, db.SQL, before, testload.Load{Producers: 2, Partitions: 10, Total: 2_000, BigTxn: 200, BigShare: 0.5, Exchange: b.Exchange})
	exec(ctx, t, db.SQL, "TRUNCATE outbox")
	produce(ctx, t, db, b, v, load{producers: 2, partitions: 10, total: 500})
	waitFor(ctx, t, rr, "done with the rows written after the TRUNCATE", func() bool { return v.Missing() == 0 })
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)
	seen := map[string]int{}
	for _, d := range v.Deliveries() {
		seen[d.MessageId]++
		if seen[d.MessageId] > 1 {
			t.Fatalf("message %s published twice", d.MessageId)
		}
	}
	// The rows written before the TRUNCATE: published at most once (those
	// the relay had read before it), the others gone with the table's rows.
	if early := len(seen) - 500; early < 0 || early > 2_000 {
		t.Fatalf("%d distinct deliveries, want the 500 written after the TRUNCATE and at most the 2,000 before", len(seen))
	} else {
		t.Logf("%d of the 2,000 rows written before the TRUNCATE were published", early)
	}
}

// modesSeen lists the modes entered so far.
func (m *modes) modesSeen() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fmt.Sprint(m.seen)
}

// statementRows writes n messages, one per transaction, from a session that
// logs statements (binlog_format=STATEMENT), in partitions odd-0..odd-2.
func statementRows(ctx context.Context, t *testing.T, db *testenv.DB, odd *oddRows, n int) {
	t.Helper()
	conn, err := db.SQL.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	exec(ctx, t, conn, "SET SESSION binlog_format = 'STATEMENT'")
	odd.write(ctx, t, conn, "message_type", n)
	exec(ctx, t, conn, "SET SESSION binlog_format = 'ROW'") // the pool's connection goes back as it came
}

// 20 rows from a session that logs statements among 300 others: an auto
// relay delivers every one (it polls, then returns to the binlog past
// them); a binlog relay stops with status FAILED naming binlog_format.
func TestStatementLoggedRows(t *testing.T) {
	t.Parallel()
	t.Run("auto", func(t *testing.T) {
		db, b := setup(t)
		v := consume(t, b, b.Queue)
		ctx := testenv.WorkContext(t)
		m := newModes()
		rr := runRelay(t, Config{MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, CheckpointInterval: time.Second,
			OnMode: m.hook, BinlogRetryInterval: 300 * time.Millisecond, PollInterval: 50 * time.Millisecond}, nil)
		m.wait(ctx, t, ModeBinlog)
		odd := &oddRows{b: b, v: v}
		load := startLoad(ctx, db, b, v, 0)
		waitReceived(ctx, t, v, 150)
		statementRows(ctx, t, db, odd, 20)
		waitReceived(ctx, t, v, 300)
		load.stop(t)
		settle(ctx, t, v)
		if err := v.Check(validator.ExactlyOnce); err != nil {
			t.Fatal(err)
		}
		if seen := m.modesSeen(); !strings.Contains(seen, "poll") {
			t.Fatalf("modes %s: the statements must send the relay to poll mode", seen)
		}
		waitFor(ctx, t, rr, "back in binlog mode", rr.r.Tailing)
	})
	t.Run("binlog", func(t *testing.T) {
		db, b := setup(t)
		v := consume(t, b, b.Queue)
		ctx := testenv.WorkContext(t)
		cfg := Config{MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, CheckpointInterval: time.Second, Mode: ModeBinlog}
		rr := runRelay(t, cfg, nil)
		waitFor(ctx, t, rr, "tailing", rr.r.Tailing)
		odd := &oddRows{b: b, v: v}
		load := startLoad(ctx, db, b, v, 0)
		waitReceived(ctx, t, v, 150)
		statementRows(ctx, t, db, odd, 20)
		load.stop(t)
		err := exitErr(t, rr, "binlog mode went on past statement-logged outbox rows")
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "binlog_format") || !strings.Contains(err.Error(), "Config.Mode auto") {
			t.Fatalf("Run returned %v, want a *ConfigError naming binlog_format and the way out", err)
		}
		if st := readStatus(ctx, t, db.SQL, relayNameFor(db.Name)); st.Status != "FAILED" {
			t.Fatalf("status %s, want FAILED", st.Status)
		}
		auto := cfg
		auto.Mode, auto.BinlogRetryInterval, auto.PollInterval = ModeAuto, 300*time.Millisecond, 50*time.Millisecond
		runRelay(t, auto, nil)
		settle(ctx, t, v)
		if err := v.Check(validator.AtLeastOnce); err != nil {
			t.Fatal(err)
		}
	})
}

// binlog_format changed to MIXED globally while an auto relay runs under
// load: said at once (poll mode, naming it); rows from sessions opened
// since (logged as statements) are delivered; back to ROW, back to the
// binlog. Nothing stranded, every row once in order.
func TestGlobalFormatChangedWhileRunning(t *testing.T) {
	t.Parallel()
	srv, db, b := privateSetup(t)
	v := consume(t, b, b.Queue)
	ctx := testenv.WorkContext(t)
	m := newModes()
	var reasons []string
	var mu sync.Mutex
	rr := runRelay(t, Config{MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, CheckpointInterval: time.Second,
		OnMode: func(mode Mode, reason string) {
			mu.Lock()
			reasons = append(reasons, reason)
			mu.Unlock()
			m.hook(mode, reason)
		},
		BinlogRetryInterval: 300 * time.Millisecond, PollInterval: 50 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond}, nil)
	m.wait(ctx, t, ModeBinlog)
	odd := &oddRows{b: b, v: v}
	load := startLoad(ctx, db, b, v, 0)
	waitReceived(ctx, t, v, 150)
	root := srv.Root(t)
	exec(ctx, t, root, "SET GLOBAL binlog_format = 'MIXED'")
	m.wait(ctx, t, ModePoll)
	mu.Lock()
	said := reasons[len(reasons)-1]
	mu.Unlock()
	if !strings.Contains(said, "binlog_format is MIXED") {
		t.Fatalf("poll mode because %q, want binlog_format named", said)
	}
	fresh := db.Pool(t, func(*mysql.Config) {}) // sessions opened since: MIXED
	odd.write(ctx, t, fresh, "message_type", 20)
	waitReceived(ctx, t, v, v.Received()+100)
	exec(ctx, t, root, "SET GLOBAL binlog_format = 'ROW'")
	m.wait(ctx, t, ModeBinlog)
	load.stop(t)
	settle(ctx, t, v)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	_ = rr
}

// xaPrepare runs an XA transaction writing n odd rows up to its PREPARE,
// on a connection of its own (returned: the transaction stays on it until
// decided or the connection closes). The rows are told to v only by the
// caller, once committed.
func xaPrepare(ctx context.Context, t *testing.T, db *testenv.DB, odd *oddRows, xid string, n int) (*sql.Conn, *validator.Validator) {
	t.Helper()
	conn, err := db.SQL.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := validator.New()
	exec(ctx, t, conn, "XA START '"+xid+"'")
	v := odd.v
	odd.v = held
	odd.write(ctx, t, conn, "message_type", n)
	odd.v = v
	exec(ctx, t, conn, "XA END '"+xid+"'", "XA PREPARE '"+xid+"'")
	return conn, held
}

// XA under load, in each mode: a transaction prepared then rolled back is
// never published; one prepared then committed is published once, after
// the commit, also when the relay restarted between the two.
func TestXATransactions(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{ModeAuto, ModeBinlog} {
		t.Run(string(mode), func(t *testing.T) {
			// A server of its own: an XA COMMIT whose prepare a relay's
			// stream did not read sends every relay of the server through
			// a handover, the other tests' relays on the shared server too.
			_, db, b := privateSetup(t)
			v := consume(t, b, b.Queue)
			ctx := testenv.WorkContext(t)
			cfg := Config{MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, CheckpointInterval: time.Second, Mode: mode}
			rr := runRelay(t, cfg, nil)
			waitFor(ctx, t, rr, "tailing", rr.r.Tailing)
			odd := &oddRows{b: b, v: v}
			load := startLoad(ctx, db, b, v, 0)

			rolledBack, _ := xaPrepare(ctx, t, db, odd, "rolled-back", 3)
			committed, held := xaPrepare(ctx, t, db, odd, "committed", 4)
			waitReceived(ctx, t, v, v.Received()+200) // the relay reads well past the prepares
			exec(ctx, t, rolledBack, "XA ROLLBACK 'rolled-back'")
			rolledBack.Close()
			if n := v.Unexpected(); n > 0 {
				t.Fatalf("%d deliveries of XA rows before their commit", n)
			}
			exec(ctx, t, committed, "XA COMMIT 'committed'")
			committed.Close()
			v.Expect(held.ExpectedMessages()...)

			// Prepared, the relay restarted, then committed.
			restart, held2 := xaPrepare(ctx, t, db, odd, "across-restart", 2)
			waitReceived(ctx, t, v, v.Received()+100)
			if err := rr.stop(); err != nil {
				t.Fatal(err)
			}
			rr = runRelay(t, cfg, nil)
			waitFor(ctx, t, rr, "tailing", rr.r.Tailing)
			exec(ctx, t, restart, "XA COMMIT 'across-restart'")
			restart.Close()
			v.Expect(held2.ExpectedMessages()...)
			waitReceived(ctx, t, v, v.Received()+100)
			load.stop(t)
			settle(ctx, t, v)
			if err := v.Check(validator.ExactlyOnce); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// An auto relay restarted (a deploy, a rescheduled pod) while a contract
// column is still renamed away starts and waits, in poll mode, instead of
// exiting; once the name is back it delivers everything.
func TestRestartWhileColumnRenamed(t *testing.T) {
	t.Parallel()
	db, b := setup(t)
	v := consume(t, b, b.Queue)
	ctx := testenv.WorkContext(t)
	cfg := Config{MySQLDSN: db.DSN, AMQPURL: b.URL, DefaultExchange: b.Exchange, CheckpointInterval: time.Second,
		BinlogRetryInterval: 300 * time.Millisecond, PollInterval: 50 * time.Millisecond}
	rr := runRelay(t, cfg, nil)
	waitFor(ctx, t, rr, "tailing", rr.r.Tailing)
	odd := &oddRows{b: b, v: v}
	odd.write(ctx, t, db.SQL, "message_type", 3)
	exec(ctx, t, db.SQL, "ALTER TABLE outbox CHANGE message_type acc_msg_type VARCHAR(255) NOT NULL")
	odd.write(ctx, t, db.SQL, "acc_msg_type", 3)
	waitFor(ctx, t, rr, "waiting for the column", func() bool {
		return strings.Contains(readStatus(ctx, t, db.SQL, relayNameFor(db.Name)).ModeReason, "poll mode waits")
	})
	if err := rr.stop(); err != nil {
		t.Fatal(err)
	}
	again := runRelay(t, cfg, nil)
	waitFor(ctx, t, again, "waiting for the column after the restart", func() bool {
		st := readStatus(ctx, t, db.SQL, relayNameFor(db.Name))
		return st.Leader != nil && st.Leader.Alive && strings.Contains(st.ModeReason, "poll mode waits") &&
			strings.Contains(st.ModeReason, "give the column its name back")
	})
	odd.write(ctx, t, db.SQL, "acc_msg_type", 3)
	exec(ctx, t, db.SQL, "ALTER TABLE outbox CHANGE acc_msg_type message_type VARCHAR(255) NOT NULL")
	settle(ctx, t, v)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
}
