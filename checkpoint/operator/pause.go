package operator

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
)

// Pause is the operator's `pause`: it sets the relay's status to PAUSED
// (paused_at to now and paused_epoch to NULL, unless it was paused
// already) and returns the status as it was before. A relay that has no
// progress row yet (no relay ran with this name) gets one, PAUSED, and was
// is "": its first leader starts paused. Wake the leader afterwards so it
// notices before its next heartbeat.
func Pause(ctx context.Context, db *sql.DB, relayName string) (was string, err error) {
	was, err = setStatus(ctx, db, relayName, `UPDATE outbox_relay_progress SET
		paused_at = IF(status = 'PAUSED', paused_at, UTC_TIMESTAMP(6)),
		paused_epoch = IF(status = 'PAUSED', paused_epoch, NULL),
		status = 'PAUSED' WHERE relay_name = ?`)
	if !errors.Is(err, ErrUnknownRelay) {
		return was, err
	}
	// IGNORE: a relay that created its row since is paused by the retry.
	res, err := db.ExecContext(ctx, `INSERT IGNORE INTO outbox_relay_progress (relay_name, status, paused_at)
		VALUES (?, 'PAUSED', UTC_TIMESTAMP(6))`, relayName)
	if err != nil {
		return "", fmt.Errorf("create the paused progress row of relay %q: %w", relayName, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return Pause(ctx, db, relayName)
	}
	return "", nil
}

// Resume is the operator's `resume`: status ACTIVE, the pause columns and
// failed_at cleared (a FAILED relay is resumed too). It returns the status
// as it was before.
func Resume(ctx context.Context, db *sql.DB, relayName string) (was string, err error) {
	return setStatus(ctx, db, relayName, `UPDATE outbox_relay_progress SET
		paused_at = NULL, paused_epoch = NULL, failed_at = NULL, status = 'ACTIVE' WHERE relay_name = ?`)
}

// setStatus runs update (status assigned last: MySQL evaluates a single
// table UPDATE's assignments left to right, so the IFs see the old status)
// in a transaction that first reads the old status.
func setStatus(ctx context.Context, db *sql.DB, relayName, update string) (string, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("set status of relay %q: %w", relayName, err)
	}
	defer tx.Rollback()
	var was string
	err = tx.QueryRowContext(ctx, "SELECT status FROM outbox_relay_progress WHERE relay_name = ? FOR UPDATE", relayName).Scan(&was)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("relay %q: %w", relayName, ErrUnknownRelay)
	}
	if err != nil {
		return "", fmt.Errorf("set status of relay %q: %w", relayName, err)
	}
	if _, err := tx.ExecContext(ctx, update, relayName); err != nil {
		return "", fmt.Errorf("set status of relay %q: %w", relayName, err)
	}
	if err := tx.Commit(); err != nil {
		return "", fmt.Errorf("set status of relay %q: %w", relayName, err)
	}
	return was, nil
}

// Wake ends the wait between two heartbeats of the relay's leader, so it
// reads the status at once instead of at its next heartbeat: the wake
// `pause` and `resume` send after changing the status. false when no
// process holds the lock. It is leadership.Wake, which knows the leader's
// side (its lock connection's wait); the errors and privileges are
// described there.
func Wake(ctx context.Context, db *sql.DB, relayName string) (bool, error) {
	return leadership.Wake(ctx, db, relayName)
}
