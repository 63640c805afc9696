package canal

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	"github.com/go-mysql-org/go-mysql/replication"
	"go.uber.org/zap"
)

// XA transactions (two-phase commit through a transaction manager). The
// server writes an XA transaction's rows to the binlog at XA PREPARE, in an
// event group that ends with an XA_PREPARE event, and its outcome later, in
// a group of its own: "XA COMMIT xid" or "XA ROLLBACK xid". MariaDB marks the
// prepare group's GTID event (flag FL_PREPARED_XA, with the xid); MySQL
// starts the group with an "XA START xid" statement. A one-phase commit ("XA
// COMMIT xid ONE PHASE") is an ordinary transaction on MariaDB; MySQL ends
// the group with that statement.
//
// The tailer never hands an XA transaction's outbox rows to the Handler: at
// the prepare they may still be rolled back, and at the commit they are
// long past. It passes the prepare group as a transaction without rows (so
// the position moves on) and remembers the xid with whether it wrote outbox
// rows; at an XA COMMIT of an xid that wrote some, or of one whose prepare
// it never read, Run returns an *XACommitError: the rows are committed now,
// and the caller reads them from the table. XA ROLLBACK needs nothing. The
// book holds only undecided transactions (bounded by the server's own).

// xaBook holds the XA transactions a Run saw prepared and not yet decided,
// each with how many outbox rows it wrote. It holds only undecided
// transactions: a commit or rollback read removes its entry.
type xaBook struct {
	mu       sync.Mutex
	prepared map[string]int
}

func newXABook() *xaBook { return &xaBook{prepared: make(map[string]int)} }

func (b *xaBook) prepare(xid string, rows int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prepared[xid] = rows
}

// decide forgets xid and returns what its prepare wrote, if it was seen.
func (b *xaBook) decide(xid string) (rows int, seen bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rows, seen = b.prepared[xid]
	delete(b.prepared, xid)
	return rows, seen
}

// MariaDB GTID event flags go-mysql does not name.
const (
	mariaFlPreparedXA  = 64
	mariaFlCompletedXA = 128
)

// mariaXID returns the xid a MariaDB GTID event of an XA group carries, in
// the form the binlog's XA statements write it (normXID), or "" when it has
// none. raw is the whole event (go-mysql decodes no xid).
func mariaXID(raw []byte) string {
	const header = 19
	if len(raw) < header+13 {
		return ""
	}
	body := raw[header:]
	flags := body[12]
	if flags&(mariaFlPreparedXA|mariaFlCompletedXA) == 0 {
		return ""
	}
	pos := 13
	if flags&replication.BINLOG_MARIADB_FL_GROUP_COMMIT_ID != 0 {
		pos += 8
	}
	if len(body) < pos+6 {
		return ""
	}
	format := int32(binary.LittleEndian.Uint32(body[pos:]))
	gl, bl := int(body[pos+4]), int(body[pos+5])
	pos += 6
	if len(body) < pos+gl+bl {
		return ""
	}
	return fmt.Sprintf("x'%s',x'%s',%d", hex.EncodeToString(body[pos:pos+gl]), hex.EncodeToString(body[pos+gl:pos+gl+bl]), format)
}

// xaStatement reads an XA statement of the binlog: its verb (START, END,
// COMMIT, ROLLBACK; "" when q is none), its xid normalised, and whether it
// is a one-phase commit.
func xaStatement(q []byte) (verb, xid string, onePhase bool) {
	if !hasPrefixFold(q, "XA ") {
		return "", "", false
	}
	rest := strings.TrimSpace(string(q[3:]))
	verb, rest, _ = strings.Cut(rest, " ")
	verb = strings.ToUpper(verb)
	rest = strings.TrimSpace(rest)
	if u := strings.ToUpper(rest); strings.HasSuffix(u, "ONE PHASE") {
		onePhase = true
		rest = strings.TrimSpace(rest[:len(rest)-len("ONE PHASE")])
	}
	return verb, normXID(rest), onePhase
}

// normXID makes the binlog's xid texts comparable: lower case, no spaces.
func normXID(s string) string {
	return strings.ToLower(strings.Join(strings.Fields(s), ""))
}

// xaQuery handles an XA statement of the transaction being read (verb,
// xid and onePhase from xaStatement). An already committed transaction
// (skipTxn) ends at its decision like any other, silently.
func (s *session) xaQuery(ctx context.Context, ev *replication.BinlogEvent, verb, xid string, onePhase bool) error {
	switch verb {
	case "START": // MySQL's XA group; MariaDB's comes from the GTID event
		// The group ends at its XA_PREPARE event, or (one phase) at its
		// XA COMMIT.
		s.xa, s.xid, s.explicit = true, xid, true
		return nil
	case "ROLLBACK":
		s.xaBook.decide(xid)
		return s.commit(ctx, ev)
	case "COMMIT":
		if s.skipTxn {
			s.xaBook.decide(xid)
			return s.commit(ctx, ev)
		}
		return s.xaCommit(ctx, ev, xid, onePhase)
	}
	return nil // END, PREPARE (the XA_PREPARE event ends the group)
}

// xaCommit handles "XA COMMIT xid": the rows of a one-phase commit are in
// this group, held back like a prepare's; a two-phase commit's were in the
// prepare group.
func (s *session) xaCommit(ctx context.Context, ev *replication.BinlogEvent, xid string, onePhase bool) error {
	if onePhase {
		if s.xaRows == 0 {
			return s.commit(ctx, ev)
		}
		return &XACommitError{GTID: s.txnID, XID: xid, Rows: s.xaRows, Seen: true}
	}
	rows, seen := s.xaBook.decide(xid)
	if seen && rows == 0 {
		return s.commit(ctx, ev)
	}
	return &XACommitError{GTID: s.txnID, XID: xid, Rows: rows, Seen: seen}
}

// xaPrepared ends an XA transaction's prepare group (its XA_PREPARE event):
// a transaction without rows for the Handler, whose outbox rows wait for
// the decision. A prepare older than the stream's start (skipTxn) is
// recorded too: its decision may come after it. MariaDB sends the prepare
// groups of XA transactions still undecided at the start of every dump
// (a replica needs them to apply the decision), so a Run knows them all;
// MySQL does not.
func (s *session) xaPrepared(ctx context.Context, ev *replication.BinlogEvent) error {
	s.xaBook.prepare(s.xid, s.xaRows)
	if s.xaRows > 0 && !s.skipTxn {
		s.t.log.Info("XA transaction prepared with outbox rows: they are published once its XA COMMIT is read, never after XA ROLLBACK",
			zap.String("xid", s.xid), zap.String("transaction", s.txnID), zap.Int("rows", s.xaRows))
	}
	return s.commit(ctx, ev)
}

// isXAPrepare reports whether ev ends an XA prepare group.
func isXAPrepare(ev *replication.BinlogEvent) bool {
	return ev.Header.EventType == replication.XA_PREPARE_LOG_EVENT
}
