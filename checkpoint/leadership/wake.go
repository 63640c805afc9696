package leadership

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// Wake ends the wait between two heartbeats of the relay's leader (KILL
// QUERY on the connection that holds its lock), so it reads the status at
// once instead of at its next heartbeat. false when no process holds the
// lock. The relay's own MySQL user may do this; another user needs the
// CONNECTION ADMIN privilege (MariaDB; MySQL: CONNECTION_ADMIN) or SUPER,
// and without it the error says so while the leader still notices at its
// next heartbeat.
func Wake(ctx context.Context, db *sql.DB, relayName string) (bool, error) {
	var holder sql.NullInt64
	lock := checkpoint.LockName(relayName)
	if err := db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", lock).Scan(&holder); err != nil {
		return false, fmt.Errorf("find the leader of relay %q: %w", relayName, err)
	}
	if !holder.Valid {
		return false, nil
	}
	if err := awaitLockWait(ctx, db, holder.Int64); err != nil {
		return true, fmt.Errorf("wake the leader of relay %q (connection %d): %w", relayName, holder.Int64, err)
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf("KILL QUERY %d", holder.Int64)); err != nil && !isUnknownThread(err) {
		return true, fmt.Errorf("wake the leader of relay %q (connection %d): %w", relayName, holder.Int64, err)
	}
	return true, nil
}

// wakeSettle bounds how long Wake waits for the leader's lock connection
// to be in its wait before it interrupts it anyway.
const wakeSettle = 3 * time.Second

// awaitLockWait returns once connection id is inside the leader's DO SLEEP
// (state "User sleep": a kill that lands while the statement is still
// starting is reset by the server), so that the KILL QUERY which follows
// ends that wait. A KILL QUERY of an idle
// connection does nothing: a leader elected a moment ago, or one between
// two waits, would miss the wake and see the change only at its next
// heartbeat. It returns at once when the process list does not show the
// connection (another user without PROCESS, or the leader gone), and after
// wakeSettle in any case.
func awaitLockWait(ctx context.Context, db *sql.DB, id int64) error {
	deadline := time.Now().Add(wakeSettle)
	for {
		var info, state sql.NullString
		err := db.QueryRowContext(ctx, "SELECT INFO, STATE FROM information_schema.PROCESSLIST WHERE ID = ?", id).Scan(&info, &state)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil
		case err != nil:
			return fmt.Errorf("read the process list: %w", err)
		case strings.HasPrefix(info.String, lockWaitStatement) && state.String == "User sleep", time.Now().After(deadline):
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the leader's lock connection: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
