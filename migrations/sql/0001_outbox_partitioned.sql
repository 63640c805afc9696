-- The outbox table (docs/tables.md), range-partitioned by day on created_at
-- (`migrate --partitioned`), so old rows go with a cheap DROP PARTITION
-- instead of a DELETE. Template: the table name and
-- the daily partitions (UTC days from the day of apply on, then pmax) are
-- filled in at apply time.
--
-- Differences from the plain table, forced by partitioning:
--   * The primary key is (id, created_at): every unique key must contain the
--     partitioning column. id stays first, which AUTO_INCREMENT requires.
--   * message_id cannot be UNIQUE for the same reason; it gets a plain index.
--     Uniqueness then rests on UUIDv7 generation alone.
-- pmax catches rows beyond the last daily partition, so an insert never
-- fails because partition maintenance fell behind; new days are split out of
-- it with REORGANIZE PARTITION.
-- Indexes and the created_at default otherwise as in 0001_outbox.sql (see the
-- reasons there).
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    message_id    BINARY(16)      NOT NULL,
    partition_key VARCHAR(255)    CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    exchange      VARCHAR(255)    NOT NULL DEFAULT '',
    routing_key   VARCHAR(255)    NOT NULL,
    message_type  VARCHAR(255)    NOT NULL DEFAULT '',
    headers       JSON            NULL,
    payload       LONGBLOB        NOT NULL,
    content_type  VARCHAR(100)    NOT NULL DEFAULT 'application/json',
    created_at    DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    available_at  DATETIME(6)     NULL,
    delivered_at  DATETIME(6)     NULL,
    attempts      INT UNSIGNED    NOT NULL DEFAULT 0,
    last_error    VARCHAR(1024)   NULL,
    PRIMARY KEY (id, created_at),
    KEY idx_message_id (message_id),
    KEY idx_partition_id (partition_key, id),
    KEY idx_head (partition_key, delivered_at, available_at, id),
    KEY idx_due (delivered_at, available_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
PARTITION BY RANGE COLUMNS(created_at) (
{{.Partitions}}
);
