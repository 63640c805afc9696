// Package migrations creates and checks outbox-relay's schema (docs/tables.md).
//
// The SQL lives in embedded files (sql/*.sql). [Apply] runs the versions a
// database is missing and records each in the table outbox_relay_migrations;
// it never drops or rewrites anything, so running it again is a no-op. Before
// and after applying, it compares every existing table's columns with the
// expected ones and refuses a table whose shape differs with a
// [*SchemaError] naming the table and column. Extra columns are allowed.
//
// Versions are "0001_relay_tables" for the tables shared by all outbox
// tables (outbox_relay_progress, outbox_relay_instances, outbox_failed,
// message_deduplication) and
// "0001_outbox:<table>" for each outbox table, so one database can hold
// several outbox tables (the relay's --table). "0004_dedup_consumer" keys
// the inbox (message_deduplication) by consumer, keeping its rows, and
// creates message_inbox_attempts. "0005_progress_mode_reason" adds
// outbox_relay_progress.mode_reason to a table created before it;
// "0006_pause_and_instances" adds its paused_at and paused_epoch and creates
// outbox_relay_instances; "0007_progress_failed_at" adds its failed_at;
// "0008_progress_broker" adds its broker and confirms_stalled_at;
// "0009_progress_outbox_table" adds its outbox_table, leader_lease_ms and
// leader_conn_id; "0010_progress_stream_ids" adds its stream_ids (the
// stream destination's publishing ids); "0011_stream_consumer_offsets"
// creates stream_consumer_offsets (dedup.StreamConsumer's offsets).
// A running relay checks that every column it uses
// exists (Current) and otherwise exits naming migrate.
// "0003_created_at_utc:<table>" follows the
// outbox's state rather than the record: it runs on an outbox whose
// created_at defaults to the session's local time (CURRENT_TIMESTAMP(6), as
// earlier versions created it) and makes the default UTC_TIMESTAMP(6).
//
// The DDL is limited to what both MySQL 8.0+ and MariaDB 10.6+ accept: CREATE
// TABLE IF NOT EXISTS, and no IF NOT EXISTS on columns or indexes. A later
// version that alters a table relies on the version record, not on IF NOT
// EXISTS, to run exactly once.
//
// Concurrent Apply calls (two `outbox-relay migrate` at once) serialise on
// GET_LOCK('outbox-relay:migrate').
package migrations
