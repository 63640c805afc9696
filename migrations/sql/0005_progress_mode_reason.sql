-- Why the relay is in its mode (mode_reason, docs/tables.md), apart from
-- last_error, which holds only errors. Rows are kept; the column starts
-- NULL. A progress table created by this version's 0001 already has it.
--
-- As in 0004, the ALTER is chosen from the table's current shape and run as
-- a prepared statement, so this file can run again without effect.
SET @progress_has_reason = (SELECT COUNT(*) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_progress' AND COLUMN_NAME = 'mode_reason');
SET @progress_alter = IF(@progress_has_reason = 0,
    'ALTER TABLE outbox_relay_progress ADD COLUMN mode_reason VARCHAR(1024) NULL AFTER mode', 'DO 0');
PREPARE progress_alter FROM @progress_alter;
EXECUTE progress_alter;
DEALLOCATE PREPARE progress_alter;
