package checkpoint

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"strconv"
)

// PollLockSlots is how many poll locks a relay name has: PollLockName(name,
// 0) to PollLockName(name, PollLockSlots-1). A database connection of the
// relay that holds row locks while it waits on something outside the
// database (a poll round publishing and waiting for the broker's confirms,
// the binlog relay's acknowledgement) holds one of them for as long as it lives, so that a new leader can find it
// and end it (leadership.Elector, takeover). Twice the most poll workers one
// call may run (64), so a Run and a Drain at once, the due-time sweeper and
// the locks of a stopped process not yet ended all find one free.
const PollLockSlots = 128

// pollLockPrefix starts every poll lock name. LockName never produces it
// (its names start "outbox-relay:"), so a poll lock is never a leadership
// lock, whatever the relay name.
const pollLockPrefix = "outbox-relay-poll"

// maxLockName is the longest user lock name MySQL takes (error 3057 past it).
const maxLockName = 64

// PollLockName is the name of poll lock slot (0 ≤ slot < PollLockSlots) of
// relayName: "outbox-relay-poll:<slot>:<relay name>", or, when that is longer
// than the 64 characters MySQL allows, "outbox-relay-poll#<slot>#" and the
// first 32 hex digits of the SHA-256 of the relay name. The slot comes
// first and the two forms differ in their separator, so no two (relay
// name, slot) pairs share a name: a takeover of one relay name never finds a
// connection of another.
func PollLockName(relayName string, slot int) string {
	name := pollLockPrefix + ":" + strconv.Itoa(slot) + ":" + relayName
	if len(name) <= maxLockName {
		return name
	}
	sum := sha256.Sum256([]byte(relayName))
	return pollLockPrefix + "#" + strconv.Itoa(slot) + "#" + hex.EncodeToString(sum[:16])
}

// TakePollLock takes a free poll lock of relayName on conn, trying the slots
// from start on (modulo PollLockSlots) without waiting, and returns the
// slot it took, or -1 when every slot is held by another connection. The
// lock lasts as long as conn: close conn with DiscardConn, never back into
// the pool.
func TakePollLock(ctx context.Context, conn *sql.Conn, relayName string, start int) (int, error) {
	for i := range PollLockSlots {
		slot := (start + i) % PollLockSlots
		name := PollLockName(relayName, slot)
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", name).Scan(&got); err != nil {
			return -1, fmt.Errorf("take poll lock %q: %w", name, err)
		}
		if got.Valid && got.Int64 == 1 {
			return slot, nil
		}
	}
	return -1, nil
}

// DiscardConn closes conn for good rather than returning it to the pool,
// where its user locks (and a broken or killed session) would pass to the
// pool's next user.
func DiscardConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}
