-- The outbox table (design §2), not partitioned. Template: the table name is
-- filled in at apply time.
--
-- partition_key is utf8mb4_bin: an ordering group is exactly the bytes the
-- producer wrote, as the binlog path hashes them; a case- or
-- trailing-space-insensitive collation would merge groups in the poller's
-- GROUP BY that the binlog path keeps apart.
--
-- Indexes:
--   uq_message_id         message_id is the identity; unique, so a producer
--                         bug that reuses an id fails loudly at insert, and
--                         lookups by message id are cheap.
--   idx_partition_id      (partition_key, id): the poller's head-of-line
--                         query takes MIN(id) GROUP BY partition_key (a loose
--                         index scan over this index) and then reads a claimed
--                         partition's following rows in id order.
--   idx_available_at      (available_at): the due-time sweep for delayed
--                         messages looks only at rows with available_at set.
-- The poller issue refines these with EXPLAIN.
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
    created_at    DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    available_at  DATETIME(6)     NULL,
    delivered_at  DATETIME(6)     NULL,
    attempts      INT UNSIGNED    NOT NULL DEFAULT 0,
    last_error    VARCHAR(1024)   NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_message_id (message_id),
    KEY idx_partition_id (partition_key, id),
    KEY idx_available_at (available_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
