package outbox

import (
	"fmt"

	"github.com/google/uuid"
)

// newIDs returns n fresh UUIDv7 message ids in increasing order.
//
// Monotonicity comes from github.com/google/uuid (v1.6.0): NewV7 takes the
// 48-bit millisecond time plus a 12-bit sub-millisecond sequence under a
// process-wide mutex and bumps it by one whenever the clock has not moved
// (or went backwards), so bytes 0-7 of every id are strictly greater than
// those of any id generated before it in this process, by any goroutine.
// The random bits (rand_b) never take part in the order. We rely on that
// instead of keeping our own generator state, and id_test.go pins the
// property so a dependency change cannot silently break it.
func newIDs(n int) ([]MessageID, error) {
	ids := make([]MessageID, n)
	for i := range ids {
		u, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("generate message id: %w", err)
		}
		ids[i] = MessageID(u)
	}
	return ids, nil
}
