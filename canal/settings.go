package canal

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// Settings are the server's global settings the binlog's outbox rows depend
// on: what new writer sessions get. RowMetadata is "" on a server without
// the variable.
type Settings struct {
	Format, RowImage, RowMetadata string
}

// ReadSettings reads the server's global Settings in one statement, which a
// server without binlog_row_metadata (too old for binlog mode anyway)
// refuses.
func ReadSettings(ctx context.Context, db *sql.DB) (Settings, error) {
	var s Settings
	err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.binlog_format, @@GLOBAL.binlog_row_image, @@GLOBAL.binlog_row_metadata").
		Scan(&s.Format, &s.RowImage, &s.RowMetadata)
	if err != nil {
		return Settings{}, fmt.Errorf("read the server's binlog settings: %w", err)
	}
	return s, nil
}

// Problems lists what in s keeps the binlog from carrying every outbox row
// as rows with their column names, each with its fix; nil when nothing does.
func (s Settings) Problems() []*PreflightError {
	var p []*PreflightError
	if !strings.EqualFold(s.Format, "ROW") {
		p = append(p, &PreflightError{Check: CheckFormat, Problem: "binlog_format is " + s.Format,
			Fix: "set binlog_format=ROW (my.cnf [mysqld] binlog-format=ROW, or SET GLOBAL binlog_format='ROW'; " +
				"sessions opened meanwhile keep the format they started with)"})
	}
	if !strings.EqualFold(s.RowImage, "FULL") {
		p = append(p, &PreflightError{Check: CheckRowImage, Problem: "binlog_row_image is " + s.RowImage,
			Fix: "set binlog_row_image=FULL (my.cnf [mysqld] binlog-row-image=FULL, or SET GLOBAL binlog_row_image='FULL')"})
	}
	if !strings.EqualFold(s.RowMetadata, "FULL") {
		p = append(p, &PreflightError{Check: CheckRowMetadata, Problem: "binlog_row_metadata is " + s.RowMetadata,
			Fix: "set binlog_row_metadata=FULL (my.cnf [mysqld] binlog-row-metadata=FULL, or SET GLOBAL binlog_row_metadata='FULL')"})
	}
	return p
}

func (s Settings) String() string {
	return fmt.Sprintf("binlog_format=%s binlog_row_image=%s binlog_row_metadata=%s", s.Format, s.RowImage, s.RowMetadata)
}
