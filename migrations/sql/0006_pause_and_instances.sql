-- Pause and the instances of a relay name (docs/tables.md).
--
-- outbox_relay_progress gets paused_at (when `outbox-relay pause` was
-- given; NULL while ACTIVE) and paused_epoch (the epoch of the leader that
-- has stopped reading and publishing for the pause; NULL until one has).
-- Rows are kept. outbox_relay_instances gets one row per running process of
-- a relay name, leader or standby, with a heartbeat, so `status` shows the
-- standbys too.
--
-- As in 0005, the ALTER is chosen from the table's current shape and run as
-- a prepared statement, so this file can run again without effect. A
-- progress table created by this version's 0001 already has the columns.
SET @progress_has_paused = (SELECT COUNT(*) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_progress' AND COLUMN_NAME = 'paused_at');
SET @progress_alter = IF(@progress_has_paused = 0,
    'ALTER TABLE outbox_relay_progress ADD COLUMN paused_at DATETIME(6) NULL AFTER status, ADD COLUMN paused_epoch BIGINT NULL AFTER paused_at', 'DO 0');
PREPARE progress_alter FROM @progress_alter;
EXECUTE progress_alter;
DEALLOCATE PREPARE progress_alter;

CREATE TABLE IF NOT EXISTS outbox_relay_instances (
    relay_name VARCHAR(255) NOT NULL,
    instance   VARCHAR(255) NOT NULL,
    role       VARCHAR(16)  NOT NULL,
    started_at DATETIME(6)  NOT NULL,
    heartbeat  DATETIME(6)  NOT NULL,
    PRIMARY KEY (relay_name, instance)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
