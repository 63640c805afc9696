-- The offsets of dedup.StreamConsumer (docs/inbox.md, "Streams").
--
-- One row per (consumer, partition stream): the offset of the next message
-- the consumer is to process there, written in the same transaction as the
-- handler's effects, so a restart resumes after the last committed message
-- and each message's effect commits once, without a row per message.
-- epoch is the fencing token of the partition's owner: +1 at each claim,
-- and the offset is written only WHERE epoch = the writer's, so a process
-- that lost the partition (its lock) cannot commit another message there.
-- owner and claimed_at say which process holds it since when (for people).
-- consumer and stream are utf8mb4_bin: names are compared byte for byte.
CREATE TABLE IF NOT EXISTS stream_consumer_offsets (
    consumer    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    stream      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    next_offset BIGINT UNSIGNED NOT NULL DEFAULT 0,
    epoch       BIGINT UNSIGNED NOT NULL DEFAULT 0,
    owner       VARCHAR(255) NOT NULL DEFAULT '',
    claimed_at  DATETIME(6)  NULL,
    updated_at  DATETIME(6)  NOT NULL,
    PRIMARY KEY (consumer, stream)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
