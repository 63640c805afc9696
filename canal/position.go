package canal

import (
	"fmt"
	"strconv"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// Flavors of server, the values of Position.Flavor and Config.Flavor.
const (
	FlavorMySQL   = mysql.MySQLFlavor   // "mysql"
	FlavorMariaDB = mysql.MariaDBFlavor // "mariadb"
)

// Position is a point in the binlog: a GTID set (preferred) or file+pos when
// the server has no GTIDs.
//
// When GTIDSet is set it alone names the point; File and Pos are then only
// informational (where the tailer read it, for retention estimates). A
// Position with neither GTIDSet nor File is the zero position: Run starts it
// from the oldest binlog the server still has, in GTID mode.
type Position struct {
	Flavor  string // "mysql" | "mariadb"
	GTIDSet string // whole multi-domain set, e.g. "0-1-100,1-1-5" (MariaDB) or MySQL gtid_executed form
	File    string // used only when GTIDSet == ""
	Pos     uint32
}

// IsZero reports whether p names no point at all.
func (p Position) IsZero() bool { return p.GTIDSet == "" && p.File == "" }

// String is a human form for logs and errors: "mariadb gtid 0-1-100",
// "mysql file binlog.000003:1234" or "mariadb (start of binlogs)".
func (p Position) String() string {
	fl := p.Flavor
	if fl == "" {
		fl = "?"
	}
	switch {
	case p.GTIDSet != "":
		return fl + " gtid " + p.GTIDSet
	case p.File != "":
		return fl + " file " + p.File + ":" + strconv.FormatUint(uint64(p.Pos), 10)
	default:
		return fl + " (start of binlogs)"
	}
}

// gtidMode reports whether Run streams p by GTID: always unless p is a
// file+pos position.
func (p Position) gtidMode() bool { return p.GTIDSet != "" || p.File == "" }

// parseGTIDSet parses p's GTID set in flavor's syntax; "" is the empty set.
func parseGTIDSet(flavor, s string) (mysql.GTIDSet, error) {
	set, err := mysql.ParseGTIDSet(flavor, s)
	if err != nil {
		return nil, fmt.Errorf("parse %s GTID set %q: %w", flavor, s, err)
	}
	return set, nil
}
