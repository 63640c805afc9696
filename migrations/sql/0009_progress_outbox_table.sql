-- The outbox table each relay name publishes, and its leader's lease
-- (docs/tables.md).
--
-- outbox_relay_progress gets outbox_table (the --table the leader of the
-- relay name publishes, written at the start of each leader term; NULL
-- until a leader of this version has run) and leader_lease_ms (that
-- leader's --leader-lease in milliseconds, written with it) and
-- leader_conn_id (the CONNECTION_ID() of that leader's lock connection,
-- which holds the table's lock for the term, written with it). A leader of
-- another relay name reads them to tell who holds the table's lock: a
-- live leader of another name (refused), one whose lease has run out (its
-- connection ended), or its own name's previous leader (waited for).
--
-- As in 0005 to 0008, each ALTER is chosen from the table's current shape
-- and run as a prepared statement, so this file can run again without
-- effect. A progress table created by this version's 0001 already has them.
SET @progress_has_table = (SELECT COUNT(*) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_progress' AND COLUMN_NAME = 'outbox_table');
SET @progress_alter = IF(@progress_has_table = 0,
    'ALTER TABLE outbox_relay_progress ADD COLUMN outbox_table VARCHAR(64) NULL AFTER relay_name', 'DO 0');
PREPARE progress_alter FROM @progress_alter;
EXECUTE progress_alter;
DEALLOCATE PREPARE progress_alter;
SET @progress_has_lease = (SELECT COUNT(*) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_progress' AND COLUMN_NAME = 'leader_lease_ms');
SET @progress_alter = IF(@progress_has_lease = 0,
    'ALTER TABLE outbox_relay_progress ADD COLUMN leader_lease_ms BIGINT UNSIGNED NULL AFTER leader_heartbeat', 'DO 0');
PREPARE progress_alter FROM @progress_alter;
EXECUTE progress_alter;
DEALLOCATE PREPARE progress_alter;
SET @progress_has_conn = (SELECT COUNT(*) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_progress' AND COLUMN_NAME = 'leader_conn_id');
SET @progress_alter = IF(@progress_has_conn = 0,
    'ALTER TABLE outbox_relay_progress ADD COLUMN leader_conn_id BIGINT UNSIGNED NULL AFTER leader_lease_ms', 'DO 0');
PREPARE progress_alter FROM @progress_alter;
EXECUTE progress_alter;
DEALLOCATE PREPARE progress_alter;
