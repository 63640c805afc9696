-- The RabbitMQ node the leader publishes to, and whether it confirms
-- (docs/tables.md).
--
-- outbox_relay_progress gets broker (host:port of the node the leader's
-- publisher is connected to, never credentials; NULL while it is not
-- connected or no leader runs) and confirms_stalled_at (since when the
-- broker has not confirmed messages on the wire, once that is longer than
-- the relay's stall threshold; NULL otherwise). The leader writes them when
-- they change, fenced by its epoch, and clears them when its term ends.
--
-- As in 0005 to 0007, each ALTER is chosen from the table's current shape
-- and run as a prepared statement, so this file can run again without
-- effect. A progress table created by this version's 0001 already has them.
SET @progress_has_broker = (SELECT COUNT(*) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_progress' AND COLUMN_NAME = 'broker');
SET @progress_alter = IF(@progress_has_broker = 0,
    'ALTER TABLE outbox_relay_progress ADD COLUMN broker VARCHAR(255) NULL AFTER failed_at', 'DO 0');
PREPARE progress_alter FROM @progress_alter;
EXECUTE progress_alter;
DEALLOCATE PREPARE progress_alter;
SET @progress_has_stalled = (SELECT COUNT(*) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_progress' AND COLUMN_NAME = 'confirms_stalled_at');
SET @progress_alter = IF(@progress_has_stalled = 0,
    'ALTER TABLE outbox_relay_progress ADD COLUMN confirms_stalled_at DATETIME(6) NULL AFTER broker', 'DO 0');
PREPARE progress_alter FROM @progress_alter;
EXECUTE progress_alter;
DEALLOCATE PREPARE progress_alter;
