package relay

import (
	"fmt"
	"testing"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

func sentRec(gtid string, n byte) *outbox.Record {
	return &outbox.Record{GTID: gtid, MessageID: outbox.MessageID{15: n}}
}

// The newest published position is the union of what was acknowledged and
// every transaction a message of which was sent, whatever order the lanes
// sent them in; a server lacking a sent transaction is named with its
// messages. Rows without a GTID are not tracked.
func TestPublishedLogUnionAndLoss(t *testing.T) {
	var l publishedLog
	l.startTerm(position.FlavorMariaDB)
	if err := l.acked(position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-10"}); err != nil {
		t.Fatal(err)
	}
	l.sent(sentRec("0-1-13", 1)) // lane 1 ahead of lane 0
	l.sent(sentRec("0-1-12", 2))
	l.sent(sentRec("0-1-13", 3))
	l.sent(sentRec("", 4))
	// An acknowledgement that arrives later for an older position does
	// not move the newest back.
	if err := l.acked(position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-11"}); err != nil {
		t.Fatal(err)
	}
	p, from, err := l.newest()
	if err != nil || p.GTIDSet != "0-1-13" || from != "published by this process" {
		t.Fatalf("newest = %v from %q, %v; want 0-1-13 published by this process", p, from, err)
	}
	sent, mids, gtids := l.lostOn("0-1-12")
	if sent != 2 || len(mids) != 2 || len(gtids) != 1 || gtids[0] != "0-1-13" {
		t.Fatalf("lost on 0-1-12: %d sent, ids %v, transactions %v; want 2 of 0-1-13", sent, mids, gtids)
	}
	if p, ok, _ := l.take(); !ok || p.GTIDSet != "0-1-13" {
		t.Fatalf("take = %v, %v; want 0-1-13", p, ok)
	}
	if _, ok, _ := l.take(); ok {
		t.Fatal("take reports a change twice")
	}
	l.reset()
	if p, _, _ := l.newest(); !p.IsZero() {
		t.Fatalf("after reset newest = %v, want nothing", p)
	}
}

// The message ids kept are bounded by recentLimit; a transaction larger
// than that keeps its count of messages sent.
func TestPublishedLogBounded(t *testing.T) {
	var l publishedLog
	l.startTerm(position.FlavorMariaDB)
	for i := range recentLimit + 10 {
		l.sent(sentRec("0-1-5", byte(i)))
	}
	l.sent(sentRec("0-1-6", 1))
	if l.recentRows > recentLimit {
		t.Fatalf("%d message ids kept, want at most %d", l.recentRows, recentLimit)
	}
	sent, mids, gtids := l.lostOn("0-1-4")
	if len(gtids) != 1 || gtids[0] != "0-1-6" || sent != 1 || len(mids) != 1 {
		t.Fatalf("lost: %v, %d sent, %d ids; the older transaction was evicted, want 0-1-6 alone", gtids, sent, len(mids))
	}
	var big publishedLog
	big.startTerm(position.FlavorMariaDB)
	for i := range recentLimit + 10 {
		big.sent(sentRec("0-1-5", byte(i)))
	}
	if sent, mids, _ := big.lostOn("0-1-4"); sent != recentLimit+10 || len(mids) != recentLimit {
		t.Fatalf("big transaction: %d sent, %d ids; want %d sent and %d ids", sent, len(mids), recentLimit+10, recentLimit)
	}
}

// Driven as the lanes and the acker drive it, through 1,000,000 one-message
// transactions acknowledged a thousand at a time, without a state file (no
// take) and without a failover check (no newest), the log holds no more than
// what was sent since the last acknowledgement: its memory follows what is in
// flight, not how long the relay has run.
func TestPublishedLogFollowsWhatIsInFlight(t *testing.T) {
	t.Parallel()
	const txns, ackEvery = 1_000_000, 1_000
	var l publishedLog
	l.startTerm(position.FlavorMariaDB)
	most := 0
	for i := 1; i <= txns; i++ {
		l.sent(sentRec(fmt.Sprintf("0-1-%d", i), byte(i)))
		if i%ackEvery == 0 {
			// The acknowledgement trails the lanes by one batch.
			if i > ackEvery {
				if err := l.acked(position.Position{Flavor: position.FlavorMariaDB, GTIDSet: fmt.Sprintf("0-1-%d", i-ackEvery)}); err != nil {
					t.Fatal(err)
				}
			}
			l.mu.Lock()
			most = max(most, len(l.unfolded))
			l.mu.Unlock()
		}
	}
	if most > 2*ackEvery {
		t.Fatalf("after %d transactions acknowledged %d at a time the log held up to %d unfolded GTIDs: it grows with the run", txns, ackEvery, most)
	}
	p, _, err := l.newest()
	if err != nil || p.GTIDSet != fmt.Sprintf("0-1-%d", txns) {
		t.Fatalf("newest = %v, %v; want 0-1-%d", p, err, txns)
	}
}
