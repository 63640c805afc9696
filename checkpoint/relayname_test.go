package checkpoint

import (
	"strings"
	"testing"
)

// A relay name is at most MaxRelayName characters, so that its leader's
// lock fits the 64 characters MySQL allows a lock name; characters, not
// bytes, are what the server counts.
func TestCheckRelayName(t *testing.T) {
	if MaxRelayName != 51 || len(LockName(strings.Repeat("a", MaxRelayName))) != 64 {
		t.Fatalf("MaxRelayName %d: the lock of the longest name must be 64 characters", MaxRelayName)
	}
	for _, ok := range []string{"default", strings.Repeat("a", 51), strings.Repeat("é", 51)} {
		if err := CheckRelayName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	err := CheckRelayName(strings.Repeat("a", 52))
	if err == nil || !strings.Contains(err.Error(), "at most 51") || !strings.Contains(err.Error(), "outbox-relay:aaa") {
		t.Fatalf("52 characters: %v, want a refusal naming the limit and the lock", err)
	}
}
