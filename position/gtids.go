package position

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/google/uuid"
)

// GTIDs is the set of transactions a binlog reader has passed: what its start
// position names plus every GTID added since. It answers "was this
// transaction seen?" exactly, which a position alone cannot on MariaDB, and
// it yields the reader's position.
//
// MariaDB: a position holds one GTID per domain, the last one applied
// (replica position semantics); with gtid_strict_mode=OFF a domain may carry
// transactions of several server ids whose sequence numbers interleave, so a
// lower number than the position's is not necessarily an old transaction.
// GTIDs therefore keeps, like the server's gtid_binlog_state, the highest
// sequence number per (domain, server id): a GTID d-s-n was seen when n is at
// or below the highest seen for (d, s). A start position d-s-n counts as
// every transaction of (d, s) up to n; other server ids of d start unseen.
// The caller must not feed a (domain, server id) out of order (the server
// never writes one so; a session that sets gtid_seq_no below its server's
// last number would be).
//
// MySQL: an executed GTID set, compared by containment.
//
// A GTIDs is not safe for concurrent use.
type GTIDs struct {
	flavor string
	seq    map[mariaKey]uint64   // MariaDB: highest sequence number per (domain, server id)
	last   *mysql.MariadbGTIDSet // MariaDB: the last GTID per domain (the position)
	set    *mysql.MysqlGTIDSet   // MySQL
}

type mariaKey struct{ domain, server uint32 }

// NewGTIDs starts the set at a GTID position of flavor ("" is the empty
// set). A MariaDB string may also name several server ids of one domain, as
// @@gtid_binlog_state does: each counts, and the last of a domain is its
// position entry.
func NewGTIDs(flavor, set string) (*GTIDs, error) {
	parsed, err := ParseGTIDSet(flavor, set)
	if err != nil {
		return nil, err
	}
	g := &GTIDs{flavor: flavor}
	switch s := parsed.(type) {
	case *mysql.MariadbGTIDSet:
		g.seq = make(map[mariaKey]uint64, len(s.Sets))
		g.last = s
		all, err := mariaGTIDs(set)
		if err != nil {
			return nil, err
		}
		for _, gt := range all {
			k := mariaKey{gt.DomainID, gt.ServerID}
			g.seq[k] = max(g.seq[k], gt.SequenceNumber)
		}
	case *mysql.MysqlGTIDSet:
		g.set = s
	default:
		return nil, fmt.Errorf("GTID set of flavor %q: unsupported type %T", flavor, parsed)
	}
	return g, nil
}

// mariaGTIDs parses every GTID of a MariaDB list, several of one domain
// included. "" (or blanks) is the empty list; an empty element or a
// sequence number 0 is refused, as ParseGTIDSet does.
func mariaGTIDs(s string) ([]*mysql.MariadbGTID, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	if err := checkMariaDBList(s); err != nil {
		return nil, err
	}
	var out []*mysql.MariadbGTID
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		gt, err := mysql.ParseMariadbGTID(part)
		if err != nil {
			return nil, fmt.Errorf("parse MariaDB GTID %q: %w", part, err)
		}
		out = append(out, gt)
	}
	return out, nil
}

// HasMariaDB reports whether the MariaDB GTID domain-server-seq was seen
// (never, in a MySQL set).
func (g *GTIDs) HasMariaDB(domain, server uint32, seq uint64) bool {
	top, ok := g.seq[mariaKey{domain, server}]
	return ok && seq <= top
}

// AddMariaDB records the MariaDB GTID domain-server-seq; it becomes its
// domain's entry of the position. A MySQL set ignores it.
func (g *GTIDs) AddMariaDB(domain, server uint32, seq uint64) {
	if g.last == nil {
		return
	}
	k := mariaKey{domain, server}
	if seq > g.seq[k] {
		g.seq[k] = seq
	}
	// Set rather than MariadbGTIDSet.AddSet: that logs a warning for every
	// sequence number below the domain's, which is legitimate here.
	g.last.Sets[domain] = &mysql.MariadbGTID{DomainID: domain, ServerID: server, SequenceNumber: seq}
}

// HasMySQL reports whether the MySQL GTID sid[:tag]:gno was seen (never, in
// a MariaDB set).
func (g *GTIDs) HasMySQL(sid uuid.UUID, tag mysql.Tag, gno int64) bool {
	if g.set == nil {
		return false
	}
	for _, iv := range (*g.set)[sid][tag] {
		if iv.Start <= gno && gno < iv.Stop {
			return true
		}
	}
	return false
}

// AddMySQL records the MySQL GTID sid[:tag]:gno. A MariaDB set ignores it.
func (g *GTIDs) AddMySQL(sid uuid.UUID, tag mysql.Tag, gno int64) {
	if g.set == nil {
		return
	}
	g.set.AddGTIDWithTag(sid, tag, gno)
}

// Covers reports whether every transaction p names was seen: for MariaDB each
// GTID d-s-n of p has been passed (n at or below the highest of (d, s)); for
// MySQL p's set is contained. p must be a GTID position of g's flavor.
func (g *GTIDs) Covers(p Position) (bool, error) {
	if g.last != nil {
		all, err := mariaGTIDs(p.GTIDSet)
		if err != nil {
			return false, err
		}
		for _, gt := range all {
			if !g.HasMariaDB(gt.DomainID, gt.ServerID, gt.SequenceNumber) {
				return false, nil
			}
		}
		return true, nil
	}
	other, err := ParseGTIDSet(g.flavor, p.GTIDSet)
	if err != nil {
		return false, err
	}
	return g.set.Contain(other), nil
}

// Passed records a position the reader has reached, the position after one
// transaction (such as a tailer's Commit position): each of its GTIDs was
// seen, and it becomes the position. Fed every Commit position in order,
// the set holds every GTID the stream carried.
func (g *GTIDs) Passed(p Position) error {
	if g.last != nil {
		all, err := mariaGTIDs(p.GTIDSet)
		if err != nil {
			return err
		}
		for _, gt := range all {
			g.AddMariaDB(gt.DomainID, gt.ServerID, gt.SequenceNumber)
		}
		return nil
	}
	if err := g.set.Update(p.GTIDSet); err != nil {
		return fmt.Errorf("parse MySQL GTID set %q: %w", p.GTIDSet, err)
	}
	return nil
}

// Set is the reader's position as a go-mysql GTID set (a copy), to start a
// binlog dump from.
func (g *GTIDs) Set() mysql.GTIDSet {
	if g.last != nil {
		return g.last.Clone()
	}
	return g.set.Clone()
}

// String is the reader's position in the server's syntax: one GTID per
// domain on MariaDB (the last one added), the executed set on MySQL.
func (g *GTIDs) String() string {
	if g.last != nil {
		return g.last.String()
	}
	return g.set.String()
}

// State lists every transaction the set holds, as a GTID list the server's
// @@gtid_binlog_state would write (MariaDB: the highest sequence number of
// each domain and server id, ordered by both) or the executed set (MySQL).
// Unlike String it does not depend on the order GTIDs were added in, so it
// serves as the union of transactions fed in any order; Missing and NewGTIDs
// read it.
func (g *GTIDs) State() string {
	if g.last == nil {
		return g.set.String()
	}
	keys := make([]mariaKey, 0, len(g.seq))
	for k := range g.seq {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b mariaKey) int {
		if c := cmp.Compare(a.domain, b.domain); c != 0 {
			return c
		}
		return cmp.Compare(a.server, b.server)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d-%d-%d", k.domain, k.server, g.seq[k])
	}
	return strings.Join(parts, ",")
}
