package streams

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Fresh ids (a term whose ids do not continue stored counters) start above
// the broker's last id for the producer, above every id this process gave
// the name (a publisher of an earlier term whose messages may still be on
// the wire), and at the relay epoch's base, epoch<<EpochBits, which is
// above every id an older epoch's fresh term could have given (a frozen old
// leader still sending): none of them can make the broker drop a new
// message as a duplicate of another one.
func TestUnitFreshIDsStartAboveEveryOlderPublisher(t *testing.T) {
	base := uint64(7) << EpochBits
	cases := []struct {
		broker, issued uint64
		epoch          int64
		want           uint64
	}{
		{0, 0, 0, 0},
		{0, 0, 7, base - 1},               // first start of epoch 7: ids from 7<<40
		{12, 0, 7, base - 1},              // broker behind the base
		{base + 5, 0, 7, base + 5},        // broker ahead (this epoch's earlier term)
		{base + 5, base + 9, 7, base + 9}, // this process sent further, not yet stored
		{base + 9, base + 5, 7, base + 9},
		{3, 10, 0, 10},
	}
	for _, c := range cases {
		if got := FreshAfter(c.broker, c.issued, c.epoch); got != c.want {
			t.Errorf("FreshAfter(%d, %d, epoch %d) = %d, want %d", c.broker, c.issued, c.epoch, got, c.want)
		}
	}
	// Every id an epoch's fresh term gives stays below the next epoch's base.
	if EpochBase(8)-EpochBase(7) != 1<<EpochBits {
		t.Fatalf("epoch bases %d, %d", EpochBase(7), EpochBase(8))
	}

	var is Issued
	is.Note("r-0", 5)
	is.Note("r-0", 3)
	is.Note("r-1", 9)
	if is.Last("r-0") != 5 || is.Last("r-1") != 9 || is.Last("r-2") != 0 {
		t.Fatalf("issued: r-0 %d, r-1 %d, r-2 %d", is.Last("r-0"), is.Last("r-1"), is.Last("r-2"))
	}
	var none *Issued // a publisher without a process-wide record
	none.Note("x", 1)
	if none.Last("x") != 0 {
		t.Fatal("nil Issued")
	}
}

// blockingQuerier is a broker that does not answer queries until release
// closes.
type blockingQuerier struct{ release chan struct{} }

func (q blockingQuerier) QuerySequence(name, stream string) (int64, error) {
	<-q.release
	return 0, errors.New("released")
}

// No broker call runs under the lock that Ready (ConfirmWait) and Close
// need, and each is bounded by the caller's context: a broker that stops
// answering neither hangs /readyz nor the end of a term.
func TestUnitBrokerCallsHoldNoLockAndEndWithTheContext(t *testing.T) {
	q := blockingQuerier{release: make(chan struct{})}
	p := newPublisher(Config{Stream: "s", Partitions: 2, Producer: "r"}, q, nil, nil, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := p.LastIDs(ctx, "r"); done <- err }()
	time.Sleep(20 * time.Millisecond) // the query is under way

	waited := make(chan struct{})
	go func() { p.ConfirmWait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(2 * time.Second):
		t.Fatal("ConfirmWait (/readyz) waits for a broker call")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("LastIDs after its context ended: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("LastIDs outlives its context")
	}
	closed := make(chan struct{})
	go func() { _ = p.Close(); close(closed) }()
	time.Sleep(20 * time.Millisecond)
	close(q.release) // a closed connection makes the client's call return
	select {
	case <-closed:
	case <-time.After(2 * time.Second):
		t.Fatal("Close hangs")
	}
}
