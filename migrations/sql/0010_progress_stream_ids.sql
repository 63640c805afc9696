-- The stream destination's publishing ids (docs/tables.md).
--
-- outbox_relay_progress gets stream_ids: with --stream, the publishing id
-- of the last message of each partition at or before the stored position,
-- written in the same fenced statement as the position (so they always
-- describe the same point), as JSON {"stream":NAME,"partitions":N,
-- "ids":[...]}. Every other write of the position (a leader publishing to
-- exchanges, `checkpoint set`) sets it NULL: the ids then no longer
-- continue the position, and the next stream leader starts above the
-- broker's last ids instead.
--
-- As in 0005 to 0009, the ALTER is chosen from the table's current shape
-- and run as a prepared statement, so this file can run again without
-- effect. A progress table created by this version's 0001 already has it.
SET @progress_has_ids = (SELECT COUNT(*) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_progress' AND COLUMN_NAME = 'stream_ids');
SET @progress_alter = IF(@progress_has_ids = 0,
    'ALTER TABLE outbox_relay_progress ADD COLUMN stream_ids TEXT NULL AFTER binlog_pos', 'DO 0');
PREPARE progress_alter FROM @progress_alter;
EXECUTE progress_alter;
DEALLOCATE PREPARE progress_alter;
