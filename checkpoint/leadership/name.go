package leadership

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// ErrNameTaken means a relay of the same name for another database of the
// server leads: a relay name's lock, GET_LOCK('outbox-relay:<name>'), is the
// server's, not a database's, so two databases' relays of one name cannot
// both lead. Acquire returns it as a *NameTakenError; retrying does not cure
// it.
var ErrNameTaken = errors.New("the relay name is led for another database of this server")

// NameTakenError is ErrNameTaken with the two databases.
type NameTakenError struct {
	RelayName string
	Database  string // this relay's database
	Other     string // the database of the connection that holds the lock
	Conn      int64  // that connection
}

func (e *NameTakenError) Error() string {
	return fmt.Sprintf("refusing to lead relay name %q for database %q: connection %d, of database %q, holds the name's lock %q "+
		"(a relay name's lock is the server's, not a database's: two databases' relays of one name cannot both lead). "+
		"Give this relay a --relay-name of its own (Config.RelayName); the relay of database %q goes on leading",
		e.RelayName, e.Database, e.Conn, e.Other, checkpoint.LockName(e.RelayName), e.Other)
}

func (e *NameTakenError) Is(target error) bool { return target == ErrNameTaken }

// holderElsewhere checks, before a stale leader's lock connection is
// killed, that the connection is one of this database: this relay's
// progress row without a fresh heartbeat says nothing of a relay of the
// same name for another database, which holds the same lock. It returns a
// *NameTakenError when the server shows the connection with another
// current database, nil when it shows this one or does not show it (a
// connection of another user, without the PROCESS privilege: the KILL is
// then refused, and says so).
func (l *Leader) holderElsewhere(ctx context.Context, holder int64) error {
	var ours, theirs sql.NullString
	err := l.conn.QueryRowContext(ctx,
		"SELECT DATABASE(), (SELECT DB FROM information_schema.PROCESSLIST WHERE ID = ?)", holder).Scan(&ours, &theirs)
	if err != nil {
		return fmt.Errorf("look up connection %d, which holds the lock of relay %q: %w", holder, l.el.cfg.RelayName, err)
	}
	// Names compare without case: with lower_case_table_names the server
	// may show one database as two spellings.
	if !theirs.Valid || strings.EqualFold(theirs.String, ours.String) {
		return nil
	}
	return &NameTakenError{RelayName: l.el.cfg.RelayName, Database: ours.String, Other: theirs.String, Conn: holder}
}
