-- created_at's default becomes the UTC time, whatever the producer session's
-- time_zone (see 0001_outbox.sql). Run on outbox tables that an earlier
-- version created with DEFAULT CURRENT_TIMESTAMP(6), plain or partitioned.
-- Changing a column's default is metadata only (no table copy, rows stay as
-- they are). Template: the table name is filled in at apply time.
ALTER TABLE {{.Table}} ALTER COLUMN created_at SET DEFAULT (UTC_TIMESTAMP(6));
