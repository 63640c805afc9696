package canal

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// countingHandler only counts, so the benchmark measures the tailer. It
// closes reached at the first Commit at or past end.
type countingHandler struct {
	rows    int
	end     string // GTID set
	reached chan struct{}
}

func (h *countingHandler) Row(context.Context, *outbox.Record) error { h.rows++; return nil }

func (h *countingHandler) Commit(_ context.Context, pos position.Position, _ int) error {
	have, err := position.ParseGTIDSet(FlavorMariaDB, pos.GTIDSet)
	if err != nil {
		return err
	}
	want, err := position.ParseGTIDSet(FlavorMariaDB, h.end)
	if err != nil {
		return err
	}
	if have.Contain(want) {
		select {
		case <-h.reached:
		default:
			close(h.reached)
		}
	}
	return nil
}

// BenchmarkDecode500 streams 100 transactions of 500 outbox rows (100-byte
// payloads, JSON headers) from a local server through the whole tailer:
// network read, parse, decode filter, Record mapping. Reports rows/s.
func BenchmarkDecode500(b *testing.B) {
	db := testenv.MySQL(b)
	setupOutbox(b, db)
	ctx := testCtx(b)
	start := currentPosition(b, db.SQL)
	const txns, perTxn = 100, 500
	for range txns {
		recs := newRecords(perTxn)
		for _, r := range recs {
			r.Payload = make([]byte, 100)
			r.Headers = []byte(`{"tenant":"acme","attempt":1}`)
		}
		if err := insertRecords(ctx, db.SQL, recs); err != nil {
			b.Fatal(err)
		}
	}
	end := currentPosition(b, db.SQL).GTIDSet
	cfg := tailerConfig(b, db)
	cfg.Logger = nil
	tl, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	began := time.Now()
	for range b.N {
		h := &countingHandler{end: end, reached: make(chan struct{})}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- tl.Run(runCtx, start, h) }()
		select {
		case <-h.reached:
		case err := <-done:
			b.Fatalf("Run: %v", err)
		}
		cancel()
		<-done // rows is safe to read once Run has returned
		if h.rows != txns*perTxn {
			b.Fatalf("%d rows, want %d", h.rows, txns*perTxn)
		}
	}
	b.ReportMetric(float64(txns*perTxn*b.N)/time.Since(began).Seconds(), "rows/s")
}
