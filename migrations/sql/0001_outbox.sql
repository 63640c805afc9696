-- The outbox table (docs/tables.md), not partitioned. Template: the table name is
-- filled in at apply time.
--
-- partition_key is utf8mb4_bin: an ordering group is exactly the bytes the
-- producer wrote, as the binlog path hashes them; a case- or
-- trailing-space-insensitive collation would merge groups in the poller's
-- GROUP BY that the binlog path keeps apart.
--
-- created_at defaults to UTC_TIMESTAMP(6), not CURRENT_TIMESTAMP(6): DATETIME
-- has no zone and the relay reads it as UTC, so the default must not follow
-- the producer's session time_zone (a PHP app's '+05:00' would otherwise
-- store local time, five hours off). An expression default: MariaDB 10.2+,
-- MySQL 8.0.13+. Tables made before this default get it from
-- 0003_created_at_utc.sql.
--
-- Indexes:
--   uq_message_id         message_id is the identity; unique, so a producer
--                         bug that reuses an id fails loudly at insert, and
--                         lookups by message id are cheap.
--   idx_partition_id      (partition_key, id): a claimed partition's
--                         following rows, read in id order from its head
--                         (the poller's follower query forces this index).
--   idx_head              (partition_key, delivered_at, available_at, id):
--                         the poller's candidate listing. With
--                         delivered_at IS NULL AND available_at IS NULL
--                         (pending, immediate) its entries are in
--                         (partition_key, id) order, so the pending rows
--                         after a cursor are one range read of as many
--                         entries as are listed, whatever the table's
--                         statistics say; idx_partition_id must read
--                         every row to test the same conditions. Rows
--                         with partition_key '' are read in id order
--                         from it.
--   idx_due               (delivered_at, available_at): pending rows that
--                         are due — the poller's delayed-but-due heads, the
--                         due-time sweep — without reading rows already
--                         marked delivered (--on-delivered=mark).
-- docs/poller.md has the EXPLAIN output.
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
    PRIMARY KEY (id),
    UNIQUE KEY uq_message_id (message_id),
    KEY idx_partition_id (partition_key, id),
    KEY idx_head (partition_key, delivered_at, available_at, id),
    KEY idx_due (delivered_at, available_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
