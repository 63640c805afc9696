-- Runs once, when the MySQL container initialises an empty data directory
-- (docker-entrypoint-initdb.d), after MYSQL_DATABASE=app was created.
-- Passwords here are for the local compose setup only.

-- The relay: reads the binlog as a replica and works on the app database
-- (outbox rows, outbox_relay_progress, outbox_failed). Database-level grants
-- here because the tables do not exist yet when this runs (migrate creates
-- them); docs/operations.md, "Grants per role", has the table-level grants
-- of each role for a production database.
CREATE USER IF NOT EXISTS 'relay'@'%' IDENTIFIED BY 'relay';
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'relay'@'%';
GRANT SELECT, INSERT, UPDATE, DELETE ON app.* TO 'relay'@'%';

-- 'outbox-relay migrate': creates the relay's tables in app.
CREATE USER IF NOT EXISTS 'relay_migrate'@'%' IDENTIFIED BY 'relay_migrate';
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX ON app.* TO 'relay_migrate'@'%';

-- An application (producer) account: writes business rows and outbox rows in
-- one transaction with outbox.Enqueue.
CREATE USER IF NOT EXISTS 'app'@'%' IDENTIFIED BY 'app';
GRANT SELECT, INSERT, UPDATE, DELETE ON app.* TO 'app'@'%';
