package leadership

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// waitFor, called with the table's lock free, waits out the live leader of
// another relay name whose lease ends last, whatever holds that name's lock
// (a standby of it takes the name's lock the moment its leader's connection
// is cut, while that leader may still publish), but not a stale one.
func TestWaitForOtherRelayNames(t *testing.T) {
	s := time.Second
	others := []tableLeader{
		{relayName: "stale", instance: "a", age: 11 * s, lease: 10 * s},
		{relayName: "cut", instance: "c", age: 2 * s, lease: 10 * s},
		{relayName: "cut-long", instance: "d", age: 20 * s, lease: 30 * s},
	}
	p := waitFor(others)
	if p.relayName != "cut-long" || p.wait != 10*s || p.lease != 30*s {
		t.Fatalf("waitFor: %+v, want cut-long's 10s (its lease ends after cut's 8s)", p)
	}
	if p := waitFor(others[:1]); p.wait != 0 {
		t.Fatalf("waitFor of a stale name: %+v, want no wait", p)
	}
}

// identify tells the holder of the table's lock by the connection ids the
// rows record: a live leader of another name (refuse), this name's
// previous leader (wait), a stale leader of another name (kill), or nobody
// known (wait: never refuse or kill an unknown connection).
func TestIdentifyTableLockHolder(t *testing.T) {
	s := time.Second
	live := tableLeader{relayName: "live", instance: "l", age: s, lease: 10 * s, conn: 7}
	stale := tableLeader{relayName: "stale", instance: "s", age: 11 * s, lease: 10 * s, conn: 8}
	// A stale row recording the live one's connection id (ids reused
	// after a restart of the server): the live row wins.
	reused := tableLeader{relayName: "old", instance: "o", age: time.Hour, lease: 10 * s, conn: 7}
	others := []tableLeader{reused, stale, live}
	for _, c := range []struct {
		holder, prevConn int64
		kind             holderKind
		who              string
	}{
		{7, 0, holderLive, "live"},
		{7, 7, holderLive, "live"},
		{8, 0, holderStale, "stale"},
		{8, 8, holderPredecessor, ""},
		{9, 9, holderPredecessor, ""},
		{9, 0, holderUnknown, ""},
		{0, 0, holderUnknown, ""},
	} {
		kind, o := identify(c.holder, others, c.prevConn)
		if kind != c.kind || o.relayName != c.who {
			t.Errorf("identify(%d, prev %d) = %v %q, want %v %q", c.holder, c.prevConn, kind, o.relayName, c.kind, c.who)
		}
	}
	// Without leader_conn_id (a row of an earlier version) nothing is
	// identified by it.
	if kind, _ := identify(5, []tableLeader{{relayName: "x", age: time.Hour, lease: s}}, 0); kind != holderUnknown {
		t.Errorf("a holder recorded by no row: %v, want unknown", kind)
	}
}

// The refusal names the relay name refused, the one leading, its leader,
// heartbeat age and lease, and the two fixes; never a connection to kill.
func TestTableLedErrorText(t *testing.T) {
	e := &TableLedError{Database: "shop", Table: "outbox", RelayName: "acc-other", Other: "acc", Instance: "h:7",
		Age: 1234 * time.Millisecond, Lease: 10 * time.Second, More: []string{"acc-3"}}
	for _, want := range []string{`refusing to lead relay name "acc-other"`, `outbox table "outbox" is already published by relay name "acc"`,
		`"acc-3"`, "leader h:7, heartbeat 1.234s old (lease 10s)", `Stop the relay of name "acc"`, `Config.RelayName "acc"`, "Renaming a relay"} {
		if !strings.Contains(e.Error(), want) {
			t.Errorf("%q does not say %q", e.Error(), want)
		}
	}
	if strings.Contains(strings.ToUpper(e.Error()), "KILL") {
		t.Errorf("%q tells the operator to kill a connection", e.Error())
	}
}

// refusal lists the further live names besides the holder's, not stale
// ones and not the holder's twice.
func TestRefusalMore(t *testing.T) {
	el := &Elector{cfg: Config{RelayName: "me", Table: "outbox", LeaderLease: 10 * time.Second}}
	l := &Leader{el: el, database: "shop"}
	s := time.Second
	holder := tableLeader{relayName: "a", instance: "a-1", age: s, lease: 10 * s, conn: 3}
	e := l.refusal(holder, []tableLeader{holder, {relayName: "b", age: s, lease: 10 * s}, {relayName: "c", age: 20 * s, lease: 10 * s}})
	if e.Other != "a" || e.Instance != "a-1" || fmt.Sprint(e.More) != "[b]" || !errors.Is(e, ErrTableLed) {
		t.Fatalf("refusal %+v", e)
	}
}

// A failed claim of the table ends the term (clearing the row, so the next
// leader need not wait out this lease) only when it is the refusal and no
// previous leader of the name was being waited out: after a database
// error, or while the previous leader may still publish, the row keeps
// this term's fresh heartbeat so that the next leader waits.
func TestRefusalEndsTerm(t *testing.T) {
	refused := &TableLedError{Other: "x"}
	waiting := previousLeader{instance: "cut", wait: time.Second}
	for _, c := range []struct {
		err  error
		prev previousLeader
		want bool
	}{
		{refused, previousLeader{}, true},
		{fmt.Errorf("claim: %w", refused), previousLeader{}, true},
		{refused, waiting, false},
		{errors.New("take lock: invalid connection"), previousLeader{}, false},
		{errors.New("take lock: invalid connection"), waiting, false},
	} {
		if got := refusalEndsTerm(c.err, c.prev); got != c.want {
			t.Errorf("refusalEndsTerm(%v, wait %v) = %v, want %v", c.err, c.prev.wait, got, c.want)
		}
	}
}
