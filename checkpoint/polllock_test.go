package checkpoint

import (
	"strings"
	"testing"
)

// Poll lock names fit MySQL's 64 characters, are distinct across slots and
// relay names (short and hashed forms alike), and are never a leadership
// lock name.
func TestPollLockName(t *testing.T) {
	names := []string{"default", "a", "a:1", "0:a", strings.Repeat("r", 45), strings.Repeat("r", 46), strings.Repeat("é", 120)}
	seen := map[string]string{}
	for _, relay := range names {
		for slot := range PollLockSlots {
			n := PollLockName(relay, slot)
			if len(n) > maxLockName {
				t.Fatalf("PollLockName(%q, %d) = %q: %d characters, MySQL takes at most %d", relay, slot, n, len(n), maxLockName)
			}
			if strings.HasPrefix(n, LockName("")) {
				t.Fatalf("PollLockName(%q, %d) = %q looks like a leadership lock", relay, slot, n)
			}
			if prev, ok := seen[n]; ok {
				t.Fatalf("PollLockName(%q, %d) = %q, as for %s", relay, slot, n, prev)
			}
			seen[n] = relay
		}
	}
	if got := PollLockName("default", 3); got != "outbox-relay-poll:3:default" {
		t.Errorf("PollLockName(default, 3) = %q", got)
	}
}
