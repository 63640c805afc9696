package relay

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
)

// rowImageConnector opens the relay's database sessions with
// binlog_row_image=MINIMAL where the grants allow it. The relay's own
// writes then put only what identifies a row (and, for an update, the
// columns it changes) in the binlog: an acknowledging DELETE logs each
// row's id instead of the whole row, payload included, which the server
// writes and the relay reads back from the binlog only to skip it. Only
// the producers' inserts are read from the binlog, and they keep the
// server's image (FULL, which the preflight requires).
//
// MariaDB needs SUPER or BINLOG ADMIN for the session variable (MySQL 8:
// SYSTEM_VARIABLES_ADMIN or SESSION_VARIABLES_ADMIN). Without, the first
// refusal is logged at INFO and the sessions keep the server's image; the
// relay is not asked again until it restarts.
type rowImageConnector struct {
	driver.Connector
	log     *zap.Logger
	refused atomic.Bool
}

const setMinimalRowImage = "SET SESSION binlog_row_image = 'MINIMAL'"

// errAccessDenied is ER_SPECIFIC_ACCESS_DENIED_ERROR: a privilege is missing.
const errAccessDenied = 1227

func (c *rowImageConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil || c.refused.Load() {
		return conn, err
	}
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		return conn, nil
	}
	_, err = ex.ExecContext(ctx, setMinimalRowImage, nil)
	var refused *mysql.MySQLError
	switch {
	case err == nil:
		return conn, nil
	case errors.As(err, &refused):
		// Any refusal by the server (a missing privilege, a server
		// without the variable): keep the server's image.
		if !c.refused.CompareAndSwap(false, true) {
			return conn, nil
		}
		const msg = "the relay's deletes and updates write whole rows to the binlog: " +
			"binlog_row_image=MINIMAL for its own sessions needs the BINLOG ADMIN privilege (MariaDB) or " +
			"SESSION_VARIABLES_ADMIN (MySQL 8), which its user lacks (optional, docs/operations.md)"
		if refused.Number == errAccessDenied {
			c.log.Info(msg)
		} else {
			c.log.Info("the relay's deletes and updates write whole rows to the binlog: the server refused "+
				"binlog_row_image=MINIMAL for its own sessions", zap.Error(err))
		}
		return conn, nil
	}
	_ = conn.Close()
	return nil, err
}
