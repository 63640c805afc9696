package relay

import (
	"fmt"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// The decisions on a binlog pipeline error, as read() returns it: a purged
// position is a setup error (exit 2 in --mode binlog, poll in auto mode); a
// diverged stream is neither: the term restarts from the durable checkpoint
// in every mode. (A real divergence needs the server's history to change
// during a reconnect in the middle of a transaction; the decision is what
// matters here.)
func TestPositionErrorDecisions(t *testing.T) {
	purged := positionError(fmt.Errorf("canal: %w", &canal.PurgedError{
		Position: position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-5"}, Detail: "purged"}))
	diverged := positionError(fmt.Errorf("canal: %w", &canal.DivergedError{Expected: "0-1-6", Got: "0-2-6", Rows: 3}))
	auto := &Relay{cfg: Config{Mode: ModeAuto}}
	binlog := &Relay{cfg: Config{Mode: ModeBinlog}}

	if !isFatal(purged) {
		t.Error("purged position: want fatal (a *ConfigError) in --mode binlog")
	}
	if auto.fallbackReason(purged) == "" {
		t.Error("purged position: want a fallback to poll mode in auto mode")
	}
	if isFatal(diverged) {
		t.Errorf("diverged stream: want a restart from the checkpoint, got a fatal error: %v", diverged)
	}
	if why := auto.fallbackReason(diverged); why != "" {
		t.Errorf("diverged stream: want no fallback in auto mode (restart the term), got %q", why)
	}
	if why := binlog.fallbackReason(diverged); why != "" {
		t.Errorf("diverged stream in --mode binlog: fallback %q", why)
	}
	if !strings.Contains(diverged.Error(), "restart from the durable checkpoint") {
		t.Errorf("diverged error %q does not say its remedy", diverged)
	}
}

// The handover window's buffer flushes at windowRows rows or at its byte
// bound, whichever comes first, and take empties it.
func TestWindowBufBounds(t *testing.T) {
	small := &outbox.Record{Payload: make([]byte, 10)}
	b := windowBuf{maxBytes: 1 << 20}
	for i := 1; i <= windowRows; i++ {
		if full := b.add(small); full != (i == windowRows) {
			t.Fatalf("row %d of %d small rows: full = %v", i, windowRows, full)
		}
	}
	if got := len(b.take()); got != windowRows || len(b.recs) != 0 || b.bytes != 0 {
		t.Fatalf("take: %d rows, %d left, %d bytes left", got, len(b.recs), b.bytes)
	}

	big := &outbox.Record{Payload: make([]byte, 100<<10)}
	n := 0
	for !b.add(big) {
		n++
		if n > windowRows {
			t.Fatal("100 KiB rows never fill a 1 MiB buffer")
		}
	}
	if got := len(b.take()); got*big.Size() < 1<<20 || (got-1)*big.Size() >= 1<<20 {
		t.Fatalf("flushed at %d rows of %d bytes: want the first row that reaches 1 MiB", got, big.Size())
	}
	// One row larger than the bound is flushed on its own.
	huge := &outbox.Record{Payload: make([]byte, 2<<20)}
	if !b.add(huge) {
		t.Fatal("a row larger than the bound does not flush at once")
	}
}
