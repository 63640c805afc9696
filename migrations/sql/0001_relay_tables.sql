-- Tables shared by every outbox table of the database (docs/tables.md).
-- Statements are separated by a semicolon at the end of a line.
-- Times are written in UTC by our code; column defaults use the session's
-- time zone and exist only as a fallback.

-- One row per relay name: the outbox table it publishes, the checkpoint
-- (GTID set, or file+pos when the server has no GTIDs), the leader fencing
-- token and lease, and the operator status.
CREATE TABLE IF NOT EXISTS outbox_relay_progress (
    relay_name       VARCHAR(255)    NOT NULL,
    outbox_table     VARCHAR(64)     NULL,
    flavor           VARCHAR(16)     NULL,
    gtid_set         TEXT            NULL,
    binlog_file      VARCHAR(255)    NULL,
    binlog_pos       BIGINT UNSIGNED NULL,
    stream_ids       TEXT            NULL,
    mode             VARCHAR(16)     NOT NULL DEFAULT 'binlog',
    mode_reason      VARCHAR(1024)   NULL,
    status           VARCHAR(16)     NOT NULL DEFAULT 'ACTIVE',
    paused_at        DATETIME(6)     NULL,
    paused_epoch     BIGINT          NULL,
    failed_at        DATETIME(6)     NULL,
    broker           VARCHAR(255)    NULL,
    confirms_stalled_at DATETIME(6)  NULL,
    epoch            BIGINT          NOT NULL DEFAULT 0,
    leader_instance  VARCHAR(255)    NULL,
    leader_since     DATETIME(6)     NULL,
    leader_heartbeat DATETIME(6)     NULL,
    leader_lease_ms  BIGINT UNSIGNED NULL,
    leader_conn_id   BIGINT UNSIGNED NULL,
    error_count      INT UNSIGNED    NOT NULL DEFAULT 0,
    last_error       VARCHAR(1024)   NULL,
    last_event_at    DATETIME(6)     NULL,
    updated_at       DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (relay_name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- One row per running process of a relay name, leader or standby: its
-- heartbeat shows `status` who is there. A clean stop deletes the row.
CREATE TABLE IF NOT EXISTS outbox_relay_instances (
    relay_name VARCHAR(255) NOT NULL,
    instance   VARCHAR(255) NOT NULL,
    role       VARCHAR(16)  NOT NULL,
    started_at DATETIME(6)  NOT NULL,
    heartbeat  DATETIME(6)  NOT NULL,
    PRIMARY KEY (relay_name, instance)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Messages the relay or an inbox consumer gave up on: the outbox row as it
-- was (outbox_id keeps its original id) plus why, who and when.
CREATE TABLE IF NOT EXISTS outbox_failed (
    id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    outbox_id     BIGINT UNSIGNED NOT NULL,
    message_id    BINARY(16)      NOT NULL,
    partition_key VARCHAR(255)    CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    exchange      VARCHAR(255)    NOT NULL DEFAULT '',
    routing_key   VARCHAR(255)    NOT NULL,
    message_type  VARCHAR(255)    NOT NULL DEFAULT '',
    headers       JSON            NULL,
    payload       LONGBLOB        NOT NULL,
    content_type  VARCHAR(100)    NOT NULL DEFAULT 'application/json',
    created_at    DATETIME(6)     NOT NULL,
    available_at  DATETIME(6)     NULL,
    delivered_at  DATETIME(6)     NULL,
    attempts      INT UNSIGNED    NOT NULL DEFAULT 0,
    last_error    VARCHAR(1024)   NULL,
    error         TEXT            NOT NULL,
    source        VARCHAR(16)     NOT NULL,
    failed_at     DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    -- `failed show|retry <message-id>` looks rows up by identity. Not unique:
    -- a message retried from here may fail again.
    KEY idx_message_id (message_id),
    -- `failed purge --older-than` deletes by age.
    KEY idx_failed_at (failed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- The inbox: one row per message a consumer has processed. processed_at is
-- DATETIME(6), not DATETIME, so cleanup by age is as precise as the other
-- tables' times; any DATETIME value fits.
CREATE TABLE IF NOT EXISTS message_deduplication (
    message_id   BINARY(16)   NOT NULL,
    message_name VARCHAR(255) NOT NULL DEFAULT '',
    processed_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (message_id),
    -- `dedup-cleanup` deletes by age.
    KEY idx_processed_at (processed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
