package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// A --mode binlog relay whose broker cannot be reached, stopped while it
// delivers the rows pending at its first start (the sweep): nothing can be
// published or confirmed, so the stop does not wait out --shutdown-timeout
// (5 minutes here; the run's stop helper gives up after one). Every row stays
// pending, and a relay with the broker delivers each exactly once.
func TestBinlogStopWithBrokerUnreachableDoesNotWait(t *testing.T) {
	t.Parallel()
	_, db, b := privateSetup(t)
	ctx := testenv.WorkContext(t)
	v := consume(t, b, b.Queue)
	const rows = 200
	produce(ctx, t, db, b, v, load{producers: 1, partitions: 10, total: rows, bigTxn: 10, bigShare: 0.5})
	cfg := Config{MySQLDSN: db.DSN, AMQPURL: "amqp://guest:guest@127.0.0.1:1/", DefaultExchange: b.Exchange,
		Mode: ModeBinlog, HeartbeatInterval: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Minute}
	down := runRelay(t, cfg, nil)
	waitFor(ctx, t, down, "the broker's refusal shown by readiness", func() bool {
		err := down.r.Ready()
		return err != nil && strings.Contains(err.Error(), "cannot publish")
	})
	if err := down.stop(); err != nil {
		t.Fatalf("stop with the broker unreachable: %v", err)
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", rows)

	cfg.AMQPURL, cfg.ShutdownTimeout = b.URL, 0
	runRelay(t, cfg, nil)
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
}
