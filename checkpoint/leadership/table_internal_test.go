package leadership

import (
	"strings"
	"testing"
	"time"
)

// waitFor waits out the live leader of another relay name whose lease ends
// last, but not a stale one (heartbeat older than its own lease) nor one
// whose name's lock is held (a relay of that name being refused).
func TestWaitForOtherRelayNames(t *testing.T) {
	s := time.Second
	others := []tableLeader{
		{relayName: "stale", instance: "a", age: 11 * s, lease: 10 * s},
		{relayName: "refusing", instance: "b", age: 0, lease: 60 * s, nameHeld: true},
		{relayName: "cut", instance: "c", age: 2 * s, lease: 10 * s},
		{relayName: "cut-long", instance: "d", age: 20 * s, lease: 30 * s},
	}
	p := waitFor(others)
	if p.relayName != "cut-long" || p.wait != 10*s || p.lease != 30*s {
		t.Fatalf("waitFor: %+v, want cut-long's 10s (its lease ends after cut's 8s)", p)
	}
	if p := waitFor(others[:2]); p.wait != 0 {
		t.Fatalf("waitFor of a stale and a refusing name: %+v, want no wait", p)
	}
}

// The refusal names the relay name refused, the one leading, its leader,
// heartbeat age and lease, and the two fixes; without a leading name it
// names the lock's connection.
func TestTableLedErrorText(t *testing.T) {
	e := &TableLedError{Database: "shop", Table: "outbox", RelayName: "acc-other", Other: "acc", Instance: "h:7",
		Age: 1234 * time.Millisecond, Lease: 10 * time.Second, More: []string{"acc-3"}}
	for _, want := range []string{`refusing to lead relay name "acc-other"`, `outbox table "outbox" is already published by relay name "acc"`,
		`"acc-3"`, "leader h:7, heartbeat 1.234s old (lease 10s)", `Stop the relay of name "acc"`, `Config.RelayName "acc"`, "Renaming a relay"} {
		if !strings.Contains(e.Error(), want) {
			t.Errorf("%q does not say %q", e.Error(), want)
		}
	}
	u := &TableLedError{Database: "shop", Table: "outbox", RelayName: "acc-other", Conn: 42}
	for _, want := range []string{`"outbox-relay-table:shop.outbox"`, "connection 42", "SHOW PROCESSLIST"} {
		if !strings.Contains(u.Error(), want) {
			t.Errorf("%q does not say %q", u.Error(), want)
		}
	}
}
