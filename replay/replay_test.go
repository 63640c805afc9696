package replay

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// A replay writes nothing to the database: the progress row, the outbox
// rows (pending ones included) and outbox_failed are byte for byte the same
// afterwards, also when the broker returns every message (those are
// reported with their ids, not stored). The messages carry the relay's
// current epoch, and a row not due yet is left to the relay.
func TestReplayWritesNothing(t *testing.T) {
	db := testenv.MySQL(t)
	migrated(t, db)
	b := testenv.RabbitMQ(t)
	ctx := testenv.Context(t, time.Minute)
	if _, err := db.SQL.ExecContext(ctx, `INSERT INTO outbox_relay_progress
		(relay_name, flavor, gtid_set, mode, status, epoch, leader_instance, last_event_at)
		VALUES ('default', 'mariadb', '0-1-1', 'binlog', 'ACTIVE', 7, 'host:1', UTC_TIMESTAMP(6))`); err != nil {
		t.Fatal(err)
	}

	from := gtidPos(ctx, t, db.SQL)
	var want []written
	for i := range 4 {
		want = append(want, commit(ctx, t, db.SQL, time.Time{}, batch("w"+string(rune('a'+i)), 5, "k1", "k2", "")...)...)
	}
	delayed := batch("delayed", 1, "k1")
	delayed[0].AvailableAt = time.Now().Add(time.Hour)
	commit(ctx, t, db.SQL, time.Time{}, delayed...)

	tables := []string{"outbox", "outbox_relay_progress", "outbox_failed"}
	dump := func() []string {
		var out []string
		for _, tb := range tables {
			out = append(out, tableDump(ctx, t, db.SQL, tb))
		}
		return out
	}
	before := dump()

	cfg := baseConfig(t, db, b)
	cfg.Range = Range{FromGTID: from}
	s, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if s.Messages != len(want) || s.Confirmed != len(want) || s.NotDue != 1 {
		t.Fatalf("summary %+v; want %d confirmed and 1 not due", s, len(want))
	}
	checkReplayed(t, drain(t, b.URL, b.Queue), want, 7)

	// An exchange without bindings: the broker returns every message.
	unbound := b.Exchange + ".unbound"
	declareExchange(t, b.URL, unbound)
	cfg = baseConfig(t, db, b)
	cfg.Range, cfg.Exchange = Range{FromGTID: from}, unbound
	s, err = Run(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "not confirmed") || s == nil || s.Returned != len(want) || len(s.Failures) != len(want) {
		t.Fatalf("replay to an unbound exchange: %v, summary %+v; want %d returned", err, s, len(want))
	}
	var ids, wantIDs []string
	for i, f := range s.Failures {
		ids = append(ids, f.MessageID)
		wantIDs = append(wantIDs, want[i].id.String())
	}
	slices.Sort(ids)
	slices.Sort(wantIDs)
	if !slices.Equal(ids, wantIDs) || s.Failures[0].Reason != "312 NO_ROUTE" {
		t.Fatalf("failures %+v; want the %d message ids, returned 312 NO_ROUTE", s.Failures, len(want))
	}

	// An --exchange that does not exist is refused before anything is read.
	cfg = baseConfig(t, db, b)
	cfg.Range, cfg.Exchange = Range{FromGTID: from}, b.Exchange+".missing"
	var re *RefusedError
	if _, err := Run(ctx, cfg); !errors.As(err, &re) {
		t.Fatalf("replay to a missing exchange: %v; want a refusal", err)
	}

	if after := dump(); !slices.Equal(before, after) {
		for i := range tables {
			if before[i] != after[i] {
				t.Errorf("table %s changed:\nbefore:\n%s\nafter:\n%s", tables[i], before[i], after[i])
			}
		}
	}
}

func declareExchange(t *testing.T, url, name string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(name, false, false)
		}
	})
}

// A dry run publishes nothing and counts exactly the rows the filters let
// through, per exchange and routing key, with the first and last GTID; a
// --to-gtid range is inclusive and leaves out what came after it.
func TestReplayDryRunFilters(t *testing.T) {
	db := testenv.MySQL(t)
	migrated(t, db)
	b := testenv.RabbitMQ(t)
	ctx := testenv.Context(t, time.Minute)

	from := gtidPos(ctx, t, db.SQL)
	var all []written
	var gtids []string // after each transaction
	mk := func(key, rk, typ, exchange string) outbox.Message {
		return outbox.Message{PartitionKey: key, RoutingKey: rk, MessageType: typ, Exchange: exchange, Payload: []byte(`{}`)}
	}
	for i := range 12 {
		key := []string{"k1", "k2", "k3"}[i%3]
		msgs := []outbox.Message{
			mk(key, "order.placed", "order.placed", ""),
			mk(key, "order.paid", "order.paid", b.Exchange),
			mk(key, "user.created", "user.created", ""),
		}
		all = append(all, commit(ctx, t, db.SQL, time.Time{}, msgs...)...)
		gtids = append(gtids, gtidPos(ctx, t, db.SQL))
	}
	after := commit(ctx, t, db.SQL, time.Time{}, mk("k1", "order.placed", "order.placed", ""))

	cfg := baseConfig(t, db, b)
	cfg.DryRun = true
	cfg.Range = Range{FromGTID: from, ToGTID: gtids[len(gtids)-1]}
	cfg.Filter = Filter{PartitionKeys: []string{"k1", "k2"}, RoutingKeyPrefix: "order."}
	s, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// k1 and k2 are 8 of the 12 transactions; two order.* rows each.
	want := []Route{{b.Exchange, "order.paid", 8}, {b.Exchange, "order.placed", 8}}
	if s.Messages != 16 || s.Filtered != len(all)-16 || s.Transactions != 8 || !slices.Equal(s.Routes, want) {
		t.Fatalf("dry run: %d messages (filtered %d) in %d transactions, routes %+v; want 16 (filtered %d) in 8, routes %+v",
			s.Messages, s.Filtered, s.Transactions, s.Routes, len(all)-16, want)
	}
	if s.FirstGTID != gtids[0] || s.LastGTID != gtids[10] { // transaction 11 is k3's
		t.Fatalf("first %q, last %q; want %q and %q", s.FirstGTID, s.LastGTID, gtids[0], gtids[10])
	}

	cfg = baseConfig(t, db, b)
	cfg.DryRun = true
	cfg.Range = Range{FromGTID: gtids[3], ToGTID: gtids[5]}
	cfg.Filter = Filter{MessageType: "user.created"}
	if s, err = Run(ctx, cfg); err != nil || s.Messages != 2 {
		t.Fatalf("dry run of transactions 5 and 6: %v, %+v; want 2 user.created messages", err, s)
	}

	// Without an end: up to the server's position at the start, the last
	// row included.
	cfg = baseConfig(t, db, b)
	cfg.DryRun = true
	cfg.Range = Range{FromGTID: gtids[len(gtids)-1]}
	if s, err = Run(ctx, cfg); err != nil || s.Messages != len(after) {
		t.Fatalf("dry run to the end: %v, %+v; want %d message", err, s, len(after))
	}

	if n := len(drain(t, b.URL, b.Queue)); n != 0 {
		t.Fatalf("dry runs published %d messages", n)
	}

	// An end before the start is refused.
	cfg = baseConfig(t, db, b)
	cfg.Range = Range{FromGTID: gtids[5], ToGTID: gtids[3]}
	var re *RefusedError
	if _, err := Run(ctx, cfg); !errors.As(err, &re) {
		t.Fatalf("reversed range: %v; want a refusal", err)
	}
}

// An interrupted replay waits for the confirms of what it published, says
// how far it read, and a replay continued from there completes the range:
// every message at least once, repeated only the ones of the transaction the
// interruption cut.
func TestReplayInterruptedAndContinued(t *testing.T) {
	db := testenv.MySQL(t)
	migrated(t, db)
	b := testenv.RabbitMQ(t)
	ctx := testenv.Context(t, time.Minute)

	from := gtidPos(ctx, t, db.SQL)
	var want []written
	for range 40 {
		want = append(want, commit(ctx, t, db.SQL, time.Time{}, batch("i", 10, "k1", "k2", "k3")...)...)
	}
	to := gtidPos(ctx, t, db.SQL)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg := baseConfig(t, db, b)
	cfg.Range = Range{FromGTID: from, ToGTID: to}
	cfg.Rate = 400 // a second or so for the range: time to interrupt it
	cfg.ProgressInterval = 20 * time.Millisecond
	cfg.OnProgress = func(p Progress) {
		if p.Messages >= 95 {
			cancel()
		}
	}
	s, err := Run(runCtx, cfg)
	if !errors.Is(err, context.Canceled) || s == nil || !s.Interrupted {
		t.Fatalf("interrupted replay: %v, summary %+v; want context.Canceled and an interrupted summary", err, s)
	}
	first := drain(t, b.URL, b.Queue)
	if s.Messages >= len(want) || s.Confirmed != s.Messages || len(first) != s.Messages || s.Messages != 10*s.Transactions+s.PartialMessages {
		t.Fatalf("interrupted after %d messages (%d confirmed, %d in the queue, %d transactions + %d of a cut one) of %d",
			s.Messages, s.Confirmed, len(first), s.Transactions, s.PartialMessages, len(want))
	}
	t.Logf("interrupted at %s after %d messages", s.ReadUpTo, s.Messages)

	cfg = baseConfig(t, db, b)
	cfg.Range = Range{FromGTID: s.ReadUpTo.GTIDSet, ToGTID: to}
	rest, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("continued replay: %v", err)
	}
	second := drain(t, b.URL, b.Queue)
	if len(second) != len(want)-10*s.Transactions {
		t.Fatalf("continued replay published %d, want %d", len(second), len(want)-10*s.Transactions)
	}
	seen := map[string]int{}
	for _, d := range append(first, second...) {
		seen[d.MessageId]++
	}
	dups := 0
	for _, w := range want {
		switch seen[w.id.String()] {
		case 0:
			t.Fatalf("message %s replayed by neither run", w.id)
		case 2:
			dups++
		}
	}
	if dups != s.PartialMessages || rest.Messages != len(second) {
		t.Fatalf("%d messages replayed twice, want the %d of the cut transaction", dups, s.PartialMessages)
	}
}
