package position

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// Flavors of server, the values of Position.Flavor.
const (
	FlavorMySQL   = mysql.MySQLFlavor   // "mysql"
	FlavorMariaDB = mysql.MariaDBFlavor // "mariadb"
)

// Position is a point in the binlog: a GTID set (preferred) or file+pos when
// the server has no GTIDs.
//
// When GTIDSet is set it alone names the point; File and Pos are then only
// informational (where the tailer read it, for retention estimates). A
// Position with neither GTIDSet nor File is the zero position: nothing is
// stored yet, and a tailer starts it from the oldest binlog the server
// still has.
type Position struct {
	Flavor  string // FlavorMySQL | FlavorMariaDB
	GTIDSet string // whole multi-domain set, e.g. "0-1-100,1-1-5" (MariaDB) or MySQL gtid_executed form
	File    string // names the point only when GTIDSet == ""
	Pos     uint32 // offset in File
}

// IsZero reports whether p names no point at all.
func (p Position) IsZero() bool { return p.GTIDSet == "" && p.File == "" }

// GTIDMode reports whether p is streamed by GTID: always unless p is a
// file+pos position.
func (p Position) GTIDMode() bool { return p.GTIDSet != "" || p.File == "" }

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

// ParseGTIDSet parses s in flavor's syntax; "" is the empty set. A MariaDB
// list is refused when an element is empty (a stray comma, "0-1-100,"):
// go-mysql would read it as the GTID 0-0-0, putting domain 0 back at its
// start; or when a sequence number is 0: the server numbers from 1, and
// go-mysql prints 0-0-0 as nothing.
func ParseGTIDSet(flavor, s string) (mysql.GTIDSet, error) {
	if flavor == FlavorMariaDB {
		if err := checkMariaDBList(s); err != nil {
			return nil, err
		}
	}
	set, err := mysql.ParseGTIDSet(flavor, s)
	if err != nil {
		return nil, fmt.Errorf("parse %s GTID set %q: %w", flavor, s, err)
	}
	return set, nil
}

// Reached reports whether pos is at or past until. A zero until is always
// reached. GTID positions compare as sets (pos contains until); file
// positions by file name, then offset.
func Reached(pos, until Position) (bool, error) {
	if until.IsZero() {
		return true, nil
	}
	if until.GTIDSet != "" {
		if pos.GTIDSet == "" {
			return false, nil
		}
		have, err := ParseGTIDSet(pos.Flavor, pos.GTIDSet)
		if err != nil {
			return false, err
		}
		want, err := ParseGTIDSet(until.Flavor, until.GTIDSet)
		if err != nil {
			return false, err
		}
		return have.Contain(want), nil
	}
	if pos.File != until.File {
		return pos.File > until.File, nil
	}
	return pos.Pos >= until.Pos, nil
}

// checkMariaDBList refuses a MariaDB GTID list (other than "") with an
// empty element or a sequence number 0 (see ParseGTIDSet).
func checkMariaDBList(s string) error {
	if s == "" {
		return nil
	}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return fmt.Errorf("parse mariadb GTID set %q: an empty element between commas; write domain-server-sequence GTIDs separated by single commas, e.g. 0-1-100,1-1-5", s)
		}
		if i := strings.LastIndexByte(part, '-'); i >= 0 && strings.TrimLeft(part[i+1:], "0") == "" {
			return fmt.Errorf("parse mariadb GTID set %q: GTID %q has sequence number 0; sequence numbers start at 1 (leave a domain out to name its start)", s, part)
		}
	}
	return nil
}
