package canal

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	driver "github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/position"
)

// SnapshotPosition is a binlog position P that splits the server's
// transactions by visibility: every transaction at or before P is visible to
// every read that starts after SnapshotPosition returns, and no transaction
// after P was visible when it was taken. CurrentPosition does not promise
// the first half: MariaDB adds a transaction to @@gtid_binlog_pos when it
// writes it to the binlog, before its InnoDB commit becomes visible (the
// binlog fsync lies between), so a reader may find in that position a
// transaction whose rows it cannot see yet.
//
// MariaDB: START TRANSACTION WITH CONSISTENT SNAPSHOT takes an InnoDB read
// view and the binlog position (Binlog_snapshot_file/_position) under the
// lock that orders commits (LOCK_commit_ordered), and InnoDB makes
// transactions visible under that same lock in binlog order. So the
// transactions visible to the snapshot are exactly those up to that binlog
// offset, which BINLOG_GTID_POS turns into a GTID position. Visibility only
// grows: a read view created later sees all the snapshot saw.
//
// MySQL: performance_schema.log_status (BACKUP_ADMIN) reports gtid_executed
// and the binlog offset while commits are blocked, and MySQL adds a GTID to
// gtid_executed only after the engine commit of its group; both halves hold.
// Without that privilege it falls back to CurrentPosition: @@gtid_executed
// still holds only visible transactions (no loss), but a file position
// (server without GTIDs) does not.
func SnapshotPosition(ctx context.Context, db *sql.DB) (position.Position, error) {
	flavor, err := DetectFlavor(ctx, db)
	if err != nil {
		return position.Position{}, err
	}
	if flavor == FlavorMySQL {
		p, err := mysqlLogStatus(ctx, db)
		if errors.Is(err, errNoLogStatus) {
			return CurrentPosition(ctx, db)
		}
		return p, err
	}
	file, offset, err := mariadbSnapshot(ctx, db)
	if err != nil {
		return position.Position{}, err
	}
	var set sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT BINLOG_GTID_POS(?, ?)", file, offset).Scan(&set); err != nil {
		return position.Position{}, fmt.Errorf("snapshot position: BINLOG_GTID_POS(%s, %d): %w", file, offset, err)
	}
	if !set.Valid {
		return position.Position{}, fmt.Errorf("snapshot position: BINLOG_GTID_POS(%s, %d) is NULL (binlog rotated and purged meanwhile?)", file, offset)
	}
	// An empty set (nothing binlogged with a GTID yet) is the zero position,
	// as for CurrentPosition.
	return position.Position{Flavor: FlavorMariaDB, GTIDSet: set.String}, nil
}

// mariadbSnapshot opens a consistent snapshot on one connection and returns
// the binlog file and offset it corresponds to.
func mariadbSnapshot(ctx context.Context, db *sql.DB) (string, uint64, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return "", 0, fmt.Errorf("snapshot position: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT"); err != nil {
		return "", 0, fmt.Errorf("snapshot position: start a consistent snapshot: %w", err)
	}
	// Ended on this connection before it goes back to the pool; it only read.
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK") }()
	rows, err := conn.QueryContext(ctx, "SHOW SESSION STATUS LIKE 'binlog_snapshot_%'")
	if err != nil {
		return "", 0, fmt.Errorf("snapshot position: SHOW STATUS LIKE 'binlog_snapshot_%%': %w", err)
	}
	defer rows.Close()
	var file string
	var offset uint64
	var haveFile, haveOffset bool
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return "", 0, fmt.Errorf("snapshot position: %w", err)
		}
		switch strings.ToLower(name) {
		case "binlog_snapshot_file":
			file, haveFile = value, true
		case "binlog_snapshot_position":
			if _, err := fmt.Sscan(value, &offset); err != nil {
				return "", 0, fmt.Errorf("snapshot position: Binlog_snapshot_position %q: %w", value, err)
			}
			haveOffset = true
		}
	}
	if err := rows.Err(); err != nil {
		return "", 0, fmt.Errorf("snapshot position: %w", err)
	}
	if !haveFile || !haveOffset || file == "" {
		return "", 0, errors.New("snapshot position: the server reports no Binlog_snapshot_file/_position (log_bin is OFF?)")
	}
	return file, offset, nil
}

// errNoLogStatus: performance_schema.log_status cannot be read here.
var errNoLogStatus = errors.New("performance_schema.log_status unavailable")

// mysqlLogStatus reads the position from performance_schema.log_status
// (MySQL 8.0.14+, BACKUP_ADMIN).
func mysqlLogStatus(ctx context.Context, db *sql.DB) (position.Position, error) {
	var local []byte
	if err := db.QueryRowContext(ctx, "SELECT LOCAL FROM performance_schema.log_status").Scan(&local); err != nil {
		var me *driver.MySQLError
		if errors.As(err, &me) && (me.Number == 1227 || me.Number == 1142 || me.Number == 1146) {
			// 1227/1142: no BACKUP_ADMIN or SELECT; 1146: no such table (older server).
			return position.Position{}, errNoLogStatus
		}
		return position.Position{}, fmt.Errorf("snapshot position: read performance_schema.log_status: %w", err)
	}
	var st struct {
		GTIDExecuted string `json:"gtid_executed"`
		File         string `json:"binary_log_file"`
		Pos          uint32 `json:"binary_log_position"`
	}
	if err := json.Unmarshal(local, &st); err != nil {
		return position.Position{}, fmt.Errorf("snapshot position: performance_schema.log_status LOCAL %q: %w", local, err)
	}
	p := position.Position{Flavor: FlavorMySQL}
	var mode string
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_mode").Scan(&mode); err != nil {
		return position.Position{}, fmt.Errorf("snapshot position: read @@gtid_mode: %w", err)
	}
	if strings.EqualFold(mode, "ON") {
		p.GTIDSet = strings.NewReplacer("\n", "", " ", "").Replace(st.GTIDExecuted)
		return p, nil
	}
	if st.File == "" {
		return position.Position{}, errors.New("snapshot position: performance_schema.log_status names no binary log (log_bin is OFF?)")
	}
	p.File, p.Pos = st.File, st.Pos
	return p, nil
}
