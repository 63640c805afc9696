package testload

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// Load describes a producer workload.
type Load struct {
	Producers, Partitions, Total int
	BigTxn                       int     // rows of a large transaction
	BigShare                     float64 // probability that a transaction is a large one
	// Exchange is the test's exchange: every other row names it, the others
	// leave exchange '' for the relay's --default-exchange (which must be it).
	Exchange   string
	RoutingKey func(partition string) string // default "rk." + partition
	// PartitionOffset shifts the partition numbers, so that two loads
	// running at once write disjoint partitions (each partition then has one
	// writer and a known commit order).
	PartitionOffset int
	// Pace is a pause after each transaction of each producer: a steady
	// stream over a while instead of a burst.
	Pace time.Duration
	// NoKey writes every row with partition_key '' (no ordering
	// constraint); Partitions is then ignored.
	NoKey bool
	// Until, when not nil, keeps each producer writing past its share of
	// Total until it is closed: a load that outlasts faults of unknown
	// length (with a Pace, or it floods the table). Total is then the
	// least that is written.
	Until <-chan struct{}
}

// Produce writes l.Total messages (at least, with l.Until) from l.Producers goroutines into the outbox
// table of db and fails the test on error; v, when not nil, is told each
// committed message. Partition p belongs to producer
// p % Producers, so each partition's commit order is its producer's order,
// which v is told after every commit. Payloads contain 0x00 bytes; about one
// row in 50 gets a message id ending in 0x00 bytes (go-mysql strips those
// unless the relay pads them).
func Produce(ctx context.Context, t testing.TB, db *sql.DB, v *validator.Validator, l Load) {
	t.Helper()
	if err := Run(ctx, db, v, l); err != nil {
		t.Fatal(err)
	}
}

// Run is Produce returning the error, for use off the test's goroutine.
func Run(ctx context.Context, db *sql.DB, v *validator.Validator, l Load) error {
	if l.RoutingKey == nil {
		l.RoutingKey = func(p string) string { return "rk." + p }
	}
	if l.Producers < 1 || !l.NoKey && l.Partitions < l.Producers {
		return fmt.Errorf("testload: %d producers over %d partitions: want 1 <= producers <= partitions", l.Producers, l.Partitions)
	}
	per := l.Total / l.Producers
	var wg sync.WaitGroup
	errs := make(chan error, l.Producers)
	for w := 0; w < l.Producers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := []string{""}
			if !l.NoKey {
				mine = nil
				for p := w; p < l.Partitions; p += l.Producers {
					mine = append(mine, fmt.Sprintf("part-%03d-ü", p+l.PartitionOffset))
				}
			}
			seq := 0
			for seq < per || l.more() {
				n := 1
				if RandN(1000) < int(l.BigShare*1000) {
					n = l.BigTxn
					if seq < per {
						n = min(n, per-seq)
					}
				}
				exp, err := writeTxn(ctx, db, l, w, mine, seq, n)
				if err != nil {
					errs <- fmt.Errorf("producer %d: %w", w, err)
					return
				}
				if v != nil {
					v.Expect(exp...)
				}
				seq += n
				if l.Pace > 0 {
					select {
					case <-time.After(l.Pace):
					case <-ctx.Done():
						errs <- ctx.Err()
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when closed without errors
}

// more says whether a producer that wrote its share goes on: until Until
// is closed.
func (l Load) more() bool {
	if l.Until == nil {
		return false
	}
	select {
	case <-l.Until:
		return false
	default:
		return true
	}
}

func writeTxn(ctx context.Context, db *sql.DB, l Load, w int, parts []string, seq, n int) ([]validator.Expected, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		pk := parts[RandN(len(parts))]
		exchange := ""
		if (seq+i)%2 == 0 {
			exchange = l.Exchange
		}
		msgs[i] = outbox.Message{
			PartitionKey: pk, Exchange: exchange, RoutingKey: l.RoutingKey(pk), MessageType: "test.event",
			Headers: map[string]any{"producer": int64(w), "seq": int64(seq + i), "flag": true, "note": "ünï"},
			Payload: []byte(fmt.Sprintf("\x00{\"p\":%d,\"seq\":%d}\x00\x00", w, seq+i)),
		}
	}
	// About one row in 50 is inserted by hand with a message id ending in
	// zero bytes; the others go through Enqueue. Rows keep their order.
	ids := make([]outbox.MessageID, 0, n)
	var batch []outbox.Message
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		got, err := outbox.Enqueue(ctx, tx, batch...)
		ids = append(ids, got...)
		batch = batch[:0]
		return err
	}
	for _, m := range msgs {
		if RandN(50) != 0 {
			batch = append(batch, m)
			continue
		}
		if err := flush(); err != nil {
			return nil, err
		}
		var id outbox.MessageID
		if _, err := rand.Read(id[:14]); err != nil {
			return nil, err
		}
		headers, err := json.Marshal(m.Headers)
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO outbox (message_id, partition_key, exchange, routing_key,
			message_type, headers, payload) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			id[:], m.PartitionKey, m.Exchange, m.RoutingKey, m.MessageType, headers, m.Payload); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	exp := make([]validator.Expected, n)
	for i, m := range msgs {
		ex := m.Exchange
		if ex == "" {
			ex = l.Exchange
		}
		exp[i] = validator.Expected{
			ID: ids[i], PartitionKey: m.PartitionKey, Exchange: ex, RoutingKey: m.RoutingKey,
			MessageType: m.MessageType, Payload: m.Payload, Headers: m.Headers,
		}
	}
	return exp, nil
}

// RandN is a uniform random int in [0, n).
func RandN(n int) int {
	v, err := rand.Int(rand.Reader, big.NewInt(int64(n)))
	if err != nil {
		panic(err)
	}
	return int(v.Int64())
}

// WaitRows waits until the query's count reaches want, failing the test when
// the count has not moved for progress.Patience or ctx ends first.
func WaitRows(ctx context.Context, t testing.TB, db *sql.DB, query string, want int) {
	t.Helper()
	var n int
	var qerr error
	count := func() int64 {
		if qerr == nil {
			qerr = db.QueryRowContext(ctx, query).Scan(&n)
		}
		return int64(n)
	}
	err := progress.Wait(ctx, query, count, func() bool { return qerr != nil || n == want })
	if qerr != nil {
		t.Fatalf("%s: %v", query, qerr)
	}
	if err != nil {
		t.Fatalf("%s = %d, want %d: %v", query, n, want, err)
	}
}
