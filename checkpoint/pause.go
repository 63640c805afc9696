package checkpoint

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The values of outbox_relay_progress.status.
const (
	StatusActive = "ACTIVE" // the leader reads and publishes
	StatusPaused = "PAUSED" // an operator paused it: the leader keeps leadership and reads nothing further
	StatusFailed = "FAILED" // the last leader stopped on an error a restart does not cure (MarkFailed)
)

// SetByOperator begins the mode reason `checkpoint set` stores (with the
// old and new positions); the next leader logs it.
const SetByOperator = "checkpoint set by an operator"

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

// Wake ends the wait between two heartbeats of the relay's leader (KILL
// QUERY on the connection that holds its lock), so it reads the status at
// once instead of at its next heartbeat. false when no process holds the
// lock. The relay's own MySQL user may do this; another user needs the
// CONNECTION ADMIN privilege (MariaDB; MySQL: CONNECTION_ADMIN) or SUPER,
// and without it the error says so while the leader still notices at its
// next heartbeat.
func Wake(ctx context.Context, db *sql.DB, relayName string) (bool, error) {
	var holder sql.NullInt64
	lock := "outbox-relay:" + relayName
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

// MarkPaused records that this store's leader of epoch has stopped
// reading and publishing for the pause: paused_epoch, which `pause` waits
// for and `checkpoint set` requires. A resume given meanwhile (status no
// longer PAUSED) or a newer leader leaves the row unchanged.
func (s *Store) MarkPaused(ctx context.Context, epoch int64) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE outbox_relay_progress SET paused_epoch = ?
		WHERE relay_name = ? AND epoch = ? AND status = 'PAUSED'`, epoch, s.cfg.RelayName, epoch); err != nil {
		return fmt.Errorf("record the pause of relay %q: %w", s.cfg.RelayName, err)
	}
	return nil
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
