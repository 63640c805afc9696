package replay

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/position"
)

// Limits of what a Summary lists one by one; the counts are always whole.
const (
	maxFailuresListed = 100
	maxRoutes         = 10_000
)

// Summary is what a replay did (or, dry, would do).
type Summary struct {
	DryRun bool
	// From and To are the range as positions: the replay read the
	// transactions after From up to and including the one that completes
	// To. Empty: nothing lay between them.
	From, To position.Position
	Empty    bool
	// FromTime is the event time of the first transaction of the range
	// when the start was given as a time.
	FromTime time.Time
	// ReadUpTo is the position after the last transaction read: where a
	// replay that was interrupted could be continued (--from-gtid).
	ReadUpTo    position.Position
	Interrupted bool
	// PartialMessages were published from a transaction after ReadUpTo
	// that the interruption cut: a replay continued from ReadUpTo
	// publishes them again.
	PartialMessages int

	// Messages were published (dry run: would be). Each has an outcome:
	// Confirmed, Returned (the broker refused it: no queue bound, missing
	// exchange) or Rejected (nacked MaxAttempts times); messages without
	// one are Unconfirmed (interrupted replay, flush timeout).
	Messages, Confirmed, Returned, Rejected, Unconfirmed int
	// Invalid rows cannot be published as they are (the relay sends such
	// rows to outbox_failed; a replay only reports them).
	Invalid int
	// Failures lists the first returned, rejected and invalid messages.
	Failures []Failure

	Filtered int // rows the filter left out
	// NotDue rows have an available_at still in the future: the relay
	// delivers them when due; a replay leaves them alone.
	NotDue int
	// Transactions is how many transactions carried the messages;
	// FirstGTID and LastGTID are the first and the last of them (empty on
	// file positions).
	Transactions        int
	FirstGTID, LastGTID string
	// Routes counts the messages per exchange and routing key, most first.
	Routes []Route
	// OtherRoutes counts messages beyond the first 10,000 routes.
	OtherRoutes int

	Elapsed time.Duration
}

// Failure is one message that was not confirmed.
type Failure struct {
	MessageID string
	OutboxID  uint64
	Outcome   string // "returned", "rejected" or "invalid"
	Reason    string
}

// Route is the number of messages to one exchange and routing key.
type Route struct {
	Exchange, RoutingKey string
	Messages             int
}

// NotConfirmed is how many published messages have no confirm.
func (s *Summary) NotConfirmed() int { return s.Returned + s.Rejected + s.Unconfirmed + s.Invalid }

// routeKey indexes Summary routes while counting.
type routeKey struct{ exchange, routingKey string }

func sortedRoutes(m map[routeKey]int) []Route {
	out := make([]Route, 0, len(m))
	for k, n := range m {
		out = append(out, Route{Exchange: k.exchange, RoutingKey: k.routingKey, Messages: n})
	}
	slices.SortFunc(out, func(a, b Route) int {
		if c := cmp.Compare(b.Messages, a.Messages); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Exchange, b.Exchange); c != 0 {
			return c
		}
		return cmp.Compare(a.RoutingKey, b.RoutingKey)
	})
	return out
}

// addedGTID is the GTID of the transaction that took a stream from position
// prev to cur ("" when it cannot tell: file positions, or no single
// difference).
func addedGTID(flavor, prev, cur string) string {
	switch flavor {
	case canal.FlavorMariaDB:
		p, err1 := mysql.ParseMariadbGTIDSet(prev)
		c, err2 := mysql.ParseMariadbGTIDSet(cur)
		if err1 != nil || err2 != nil {
			return ""
		}
		ps := p.(*mysql.MariadbGTIDSet).Sets
		for d, g := range c.(*mysql.MariadbGTIDSet).Sets {
			if o, ok := ps[d]; !ok || *o != *g {
				return g.String()
			}
		}
	case canal.FlavorMySQL:
		p, err1 := mysql.ParseMysqlGTIDSet(prev)
		c, err2 := mysql.ParseMysqlGTIDSet(cur)
		if err1 != nil || err2 != nil {
			return ""
		}
		ps := *p.(*mysql.MysqlGTIDSet)
		for sid, tags := range *c.(*mysql.MysqlGTIDSet) {
			for tag, ivs := range tags {
				for _, iv := range ivs {
					if ps[sid][tag].Contain(mysql.IntervalSlice{iv}) {
						continue
					}
					for gno := iv.Stop - 1; gno >= iv.Start; gno-- {
						if !ps[sid][tag].Contain(mysql.IntervalSlice{{Start: gno, Stop: gno + 1}}) {
							return mysqlGTIDText(sid.String(), tag.String(), gno)
						}
					}
				}
			}
		}
	}
	return ""
}

func mysqlGTIDText(sid, tag string, gno int64) string {
	if tag != "" {
		return fmt.Sprintf("%s:%s:%d", sid, tag, gno)
	}
	return fmt.Sprintf("%s:%d", sid, gno)
}

// String is a one-line account, for logs.
func (s *Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d messages", s.Messages)
	if !s.DryRun {
		fmt.Fprintf(&b, ", %d confirmed", s.Confirmed)
	}
	fmt.Fprintf(&b, " from %d transactions after %s up to %s", s.Transactions, describe(s.From), describe(s.To))
	return b.String()
}
