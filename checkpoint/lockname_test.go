package checkpoint_test

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// A table's lock name is readable when it fits MySQL's 64 characters, and
// otherwise a 64-character digest that still tells tables apart.
func TestTableLockName(t *testing.T) {
	if got := checkpoint.TableLockName("shop", "outbox"); got != "outbox-relay-table:shop.outbox" {
		t.Errorf("short name: %q", got)
	}
	long := strings.Repeat("d", 64)
	a, b := checkpoint.TableLockName(long, "outbox"), checkpoint.TableLockName(long, "outbox2")
	if len(a) != 64 || len(b) != 64 || a == b || !strings.HasPrefix(a, "outbox-relay-table:") {
		t.Errorf("long names: %q, %q: want two different 64-character names", a, b)
	}
	if again := checkpoint.TableLockName(long, "outbox"); again != a {
		t.Errorf("not stable: %q then %q", a, again)
	}
}
