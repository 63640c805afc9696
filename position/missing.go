package position

import (
	"fmt"
	"sort"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// Missing returns the transactions of the checkpoint want that a server
// whose executed set is executed has not got, in a form for people ("" when
// it has them all). It is the check a relay runs before resuming on a server
// that may be a promoted replica: a non-empty answer means the server lost
// transactions the relay already published (a lossy failover).
//
// MariaDB: executed is the server's @@gtid_binlog_state, which keeps the
// highest sequence number of every (domain, server id) that ever wrote to
// its binlog. want is a position (one GTID per domain, the last passed, as a
// checkpoint holds; several of one domain are allowed). A GTID d-s-n of want
// is contained when executed holds (d, s) at a sequence number at or above
// n. Comparing per domain alone would not do: a promoted replica that was
// behind at d-1-90 while the relay had published up to d-1-100 writes its
// own d-2-91, d-2-92, … and soon passes 100 in domain d without ever having
// had d-1-91..d-1-100. With gtid_strict_mode off one (domain, server id) may
// skip numbers, so the missing part is named as a range "after what the
// server has, up to n", not as a list.
//
// MySQL: executed is @@gtid_executed and want a GTID set; the answer is
// want minus executed, in the server's syntax.
func Missing(flavor, executed string, want Position) (string, error) {
	if want.GTIDSet == "" {
		return "", nil
	}
	switch flavor {
	case FlavorMariaDB:
		state, err := mariaGTIDs(executed)
		if err != nil {
			return "", fmt.Errorf("server's GTID state: %w", err)
		}
		top := make(map[mariaKey]uint64, len(state))
		for _, gt := range state {
			k := mariaKey{gt.DomainID, gt.ServerID}
			top[k] = max(top[k], gt.SequenceNumber)
		}
		wanted, err := mariaGTIDs(want.GTIDSet)
		if err != nil {
			return "", fmt.Errorf("checkpoint: %w", err)
		}
		var out []string
		for _, gt := range wanted {
			have, ok := top[mariaKey{gt.DomainID, gt.ServerID}]
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("%d-%d-* up to %d-%d-%d (the server has no transaction of server id %d in domain %d)",
					gt.DomainID, gt.ServerID, gt.DomainID, gt.ServerID, gt.SequenceNumber, gt.ServerID, gt.DomainID))
			case have < gt.SequenceNumber:
				out = append(out, fmt.Sprintf("%d-%d-%d..%d-%d-%d", gt.DomainID, gt.ServerID, have+1,
					gt.DomainID, gt.ServerID, gt.SequenceNumber))
			}
		}
		return strings.Join(out, ", "), nil
	case FlavorMySQL:
		haveSet, err := ParseGTIDSet(flavor, executed)
		if err != nil {
			return "", fmt.Errorf("server's executed GTID set: %w", err)
		}
		wantSet, err := ParseGTIDSet(flavor, want.GTIDSet)
		if err != nil {
			return "", fmt.Errorf("checkpoint: %w", err)
		}
		diff := mysqlMinus(*wantSet.(*mysql.MysqlGTIDSet), *haveSet.(*mysql.MysqlGTIDSet))
		if len(diff) == 0 {
			return "", nil
		}
		return diff.String(), nil
	default:
		return "", fmt.Errorf("GTID containment for flavor %q: unsupported", flavor)
	}
}

// mysqlMinus returns the GTIDs of a that are not in b.
func mysqlMinus(a, b mysql.MysqlGTIDSet) mysql.MysqlGTIDSet {
	out := mysql.NewMysqlGTIDSet()
	for sid, tags := range a {
		for tag, ivs := range tags {
			rest := minusIntervals(ivs.Normalize(), b[sid][tag].Normalize())
			if len(rest) == 0 {
				continue
			}
			if out[sid] == nil {
				out[sid] = make(map[mysql.Tag]mysql.IntervalSlice)
			}
			out[sid][tag] = rest
		}
	}
	return out
}

// minusIntervals subtracts the sorted, disjoint half-open intervals b from
// the sorted, disjoint a.
func minusIntervals(a, b mysql.IntervalSlice) mysql.IntervalSlice {
	var out mysql.IntervalSlice
	for _, iv := range a {
		start := iv.Start
		// b's intervals that may overlap [start, iv.Stop).
		i := sort.Search(len(b), func(i int) bool { return b[i].Stop > start })
		for ; i < len(b) && b[i].Start < iv.Stop && start < iv.Stop; i++ {
			if b[i].Start > start {
				out = append(out, mysql.Interval{Start: start, Stop: b[i].Start})
			}
			start = max(start, b[i].Stop)
		}
		if start < iv.Stop {
			out = append(out, mysql.Interval{Start: start, Stop: iv.Stop})
		}
	}
	return out
}

// Added returns the GTIDs cur holds beyond prev, two positions of one
// reader in order (prev before cur): the GTIDs of the transactions between
// them; for consecutive commit positions, the transaction's own GTID. On
// MariaDB these are the entries of cur whose sequence number is above the
// highest prev holds for their domain and server id (so prev and cur may
// also be @@gtid_binlog_state lists, several server ids to a domain); on
// MySQL, cur minus prev. The result is a GTID set string of flavor, "" when
// nothing was added.
func Added(flavor, prev, cur string) (string, error) {
	switch flavor {
	case FlavorMariaDB:
		before, err := mariaGTIDs(prev)
		if err != nil {
			return "", err
		}
		top := make(map[mariaKey]uint64, len(before))
		for _, gt := range before {
			k := mariaKey{gt.DomainID, gt.ServerID}
			top[k] = max(top[k], gt.SequenceNumber)
		}
		after, err := mariaGTIDs(cur)
		if err != nil {
			return "", err
		}
		var out []string
		for _, gt := range after {
			k := mariaKey{gt.DomainID, gt.ServerID}
			if have, ok := top[k]; !ok || gt.SequenceNumber > have {
				out = append(out, gt.String())
				top[k] = gt.SequenceNumber // named once
			}
		}
		return strings.Join(out, ","), nil
	case FlavorMySQL:
		a, err := ParseGTIDSet(flavor, cur)
		if err != nil {
			return "", err
		}
		b, err := ParseGTIDSet(flavor, prev)
		if err != nil {
			return "", err
		}
		diff := mysqlMinus(*a.(*mysql.MysqlGTIDSet), *b.(*mysql.MysqlGTIDSet))
		if len(diff) == 0 {
			return "", nil
		}
		return diff.String(), nil
	default:
		return "", fmt.Errorf("GTIDs added for flavor %q: unsupported", flavor)
	}
}
