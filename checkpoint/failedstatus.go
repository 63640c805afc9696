package checkpoint

import (
	"context"
	"fmt"
)

// MarkFailed sets the relay's status to FAILED (failed_at now, the reason in
// last_error, error_count + 1): its leader of epoch is stopping on an error a
// restart does not cure (a lossy failover, a schema mismatch, a refusal of
// TLS or grants in binlog mode), so `status` says so until the next term
// that delivers (ClearFailed) or `resume`. The row is marked while its
// epoch is still epoch, or while no process holds the relay's leadership
// lock (a leader that released it, or one that never led: epoch 0), so a
// healthy leader's status is never overwritten. A missing row is created. The pause columns are cleared: a FAILED relay
// holds no pause.
func (s *Store) MarkFailed(ctx context.Context, epoch int64, reason string) error {
	const set = `UPDATE outbox_relay_progress SET status = 'FAILED', failed_at = UTC_TIMESTAMP(6),
		paused_at = NULL, paused_epoch = NULL, error_count = error_count + 1, last_error = ?
		WHERE relay_name = ? AND `
	err := EnsureRow(ctx, s.db, s.cfg.RelayName)
	if err == nil {
		_, err = s.db.ExecContext(ctx, set+"(epoch = ? OR IS_FREE_LOCK(?) = 1)", truncate(reason, 1024), s.cfg.RelayName,
			epoch, LockName(s.cfg.RelayName))
	}
	if err != nil {
		return fmt.Errorf("mark relay %q failed: %w", s.cfg.RelayName, err)
	}
	return nil
}

// ClearFailed ends a FAILED status: the leader of epoch delivers again. One
// statement that changes nothing unless the status is FAILED.
func (s *Store) ClearFailed(ctx context.Context, epoch int64) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE outbox_relay_progress SET status = 'ACTIVE', failed_at = NULL
		WHERE relay_name = ? AND epoch = ? AND status = 'FAILED'`, s.cfg.RelayName, epoch); err != nil {
		return fmt.Errorf("clear the FAILED status of relay %q: %w", s.cfg.RelayName, err)
	}
	return nil
}
