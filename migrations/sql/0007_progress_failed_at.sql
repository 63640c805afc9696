-- When the relay stopped on an error a restart does not cure (docs/tables.md).
--
-- outbox_relay_progress gets failed_at: set with status FAILED (and the
-- reason in last_error) by a relay that exits on a lossy failover, a schema
-- mismatch, or a TLS or grant refusal in binlog mode; NULL otherwise. The
-- next successful leader term, or `resume`, clears both.
--
-- As in 0005 and 0006, the ALTER is chosen from the table's current shape
-- and run as a prepared statement, so this file can run again without
-- effect. A progress table created by this version's 0001 already has it.
SET @progress_has_failed_at = (SELECT COUNT(*) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_progress' AND COLUMN_NAME = 'failed_at');
SET @progress_alter = IF(@progress_has_failed_at = 0,
    'ALTER TABLE outbox_relay_progress ADD COLUMN failed_at DATETIME(6) NULL AFTER paused_epoch', 'DO 0');
PREPARE progress_alter FROM @progress_alter;
EXECUTE progress_alter;
DEALLOCATE PREPARE progress_alter;
