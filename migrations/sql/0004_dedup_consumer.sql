-- The inbox per consuming service (docs/inbox.md).
--
-- message_deduplication gets a consumer column and the primary key
-- (consumer, message_id), so several services can share one database. Rows
-- from before keep their message and get the consumer ''. consumer is
-- utf8mb4_bin: a consumer is exactly the name the service gives, as the
-- partition keys are exactly the bytes producers wrote. idx_processed_at
-- stays for cleanup by age.
--
-- The ALTER is chosen from the table's current shape and run as a prepared
-- statement, so this file can run again without effect (neither MySQL nor
-- MariaDB accepts the other's ADD COLUMN IF NOT EXISTS). One ALTER TABLE is
-- applied as a whole or not at all. A new primary key rebuilds the table:
-- on a large inbox, run migrate when a rebuild of it is acceptable.
SET @dedup_has_consumer = (SELECT COUNT(*) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'message_deduplication' AND COLUMN_NAME = 'consumer');
SET @dedup_key = (SELECT GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) FROM information_schema.STATISTICS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'message_deduplication' AND INDEX_NAME = 'PRIMARY');
SET @dedup_alter = CASE
    WHEN @dedup_has_consumer = 0 THEN CONCAT(
        'ALTER TABLE message_deduplication ADD COLUMN consumer VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '''' FIRST, ',
        IF(@dedup_key IS NULL, '', 'DROP PRIMARY KEY, '), 'ADD PRIMARY KEY (consumer, message_id)')
    WHEN @dedup_key <=> 'consumer,message_id' THEN 'DO 0'
    ELSE CONCAT('ALTER TABLE message_deduplication ',
        IF(@dedup_key IS NULL, '', 'DROP PRIMARY KEY, '), 'ADD PRIMARY KEY (consumer, message_id)')
END;
PREPARE dedup_alter FROM @dedup_alter;
EXECUTE dedup_alter;
DEALLOCATE PREPARE dedup_alter;

-- Failed attempts of messages a dedup.Consumer has not processed yet, so
-- the number of redeliveries is bounded across restarts and processes
-- (RabbitMQ's classic queues do not count them). A row is deleted when its
-- message is processed or moved to outbox_failed; updated_at lets a cleanup
-- remove rows of messages that never came back.
CREATE TABLE IF NOT EXISTS message_inbox_attempts (
    consumer   VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id BINARY(16)    NOT NULL,
    attempts   INT UNSIGNED  NOT NULL DEFAULT 0,
    last_error VARCHAR(1024) NULL,
    updated_at DATETIME(6)   NOT NULL,
    PRIMARY KEY (consumer, message_id),
    KEY idx_updated_at (updated_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
