package mysqldouble

import (
	"fmt"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/google/uuid"
)

// storedEvent is one event of a binlog file; gtid is set on a
// transaction's GTID event ("" on the others).
type storedEvent struct {
	raw  []byte
	gtid *gtidKey
}

type gtidKey struct {
	sid uuid.UUID
	tag mysql.Tag
	gno int64
}

type binlogFile struct {
	name   string
	events []storedEvent // from the FORMAT_DESCRIPTION on
	closed bool          // ends with a ROTATE
}

// newFile starts the next binlog file: FORMAT_DESCRIPTION, then
// PREVIOUS_GTIDS with the executed set. s.mu held (or not yet shared).
func (s *Server) newFile() {
	name := fmt.Sprintf("binlog.%06d", len(s.files)+1)
	s.enc = NewEncoder(s.cfg.ServerID)
	if !s.now.IsZero() {
		s.enc.Time = s.now
	}
	f := &binlogFile{name: name}
	f.events = append(f.events,
		storedEvent{raw: s.enc.FormatDescription(s.cfg.Version.Name, s.cfg.Version.PostHeaderLens)},
		storedEvent{raw: s.enc.PreviousGTIDs(s.executed.Clone().(*mysql.MysqlGTIDSet))})
	s.files = append(s.files, f)
}

func (s *Server) current() *binlogFile { return s.files[len(s.files)-1] }

func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// SetTime makes t the time of every event written from now on (their
// header's timestamp, a GTID event's commit time, a new file's start), as
// a server's clock would: binlogs searched by time (replay --from-time)
// need transactions and files of different times.
func (s *Server) SetTime(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = t
	s.enc.Time = t
}

// Rotate ends the current file with a ROTATE and starts the next one.
func (s *Server) Rotate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.current()
	next := fmt.Sprintf("binlog.%06d", len(s.files)+1)
	cur.events = append(cur.events, storedEvent{raw: s.enc.Rotate(next)})
	cur.closed = true
	s.newFile()
	s.notify()
}

// Txn is one transaction to append.
type Txn struct {
	Tag        string // GTID tag (MySQL 8.3+: SET gtid_next='AUTOMATIC:tag')
	Anonymous  bool   // gtid_mode OFF: an ANONYMOUS_GTID
	Compressed bool   // binlog_transaction_compression=ON in the session
	Table      Table  // the rows' table
	Rows       [][]any
	Query      string // a DDL statement instead of rows
}

// Commit appends txn as MySQL writes it (GTID event; then BEGIN, TABLE_MAP,
// WRITE_ROWS v2, XID, compressed into one TRANSACTION_PAYLOAD when
// txn.Compressed; or the DDL's QUERY) and returns its GTID ("" when
// anonymous). Live dumps send it at once.
func (s *Server) Commit(txn Txn) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var key *gtidKey
	g := GTID{CommitTime: s.enc.Time, ServerVersion: s.cfg.Version.Number}
	if !txn.Anonymous && !s.cfg.GTIDModeOff {
		tag := mysql.NewTag(txn.Tag)
		gno := int64(1)
		if ivs := (*s.executed)[s.cfg.ServerUUID][tag]; len(ivs) > 0 {
			gno = ivs[len(ivs)-1].Stop
		}
		g.SID, g.Tag, g.GNO = s.cfg.ServerUUID, tag.String(), gno
		key = &gtidKey{sid: g.SID, tag: tag, gno: gno}
	}
	s.xid++
	g.SequenceNumber = int64(s.xid)
	g.LastCommitted = int64(s.xid - 1)

	// The body is written first, by a scratch encoder, to know its length.
	body, err := s.txnBody(txn)
	if err != nil {
		return "", err
	}
	var flags byte
	if txn.Query != "" {
		flags = 1 // FLAG_MAY_HAVE_SBR: DDL
	}
	// transaction_length counts the GTID event itself, whose size depends
	// on how the length is encoded: iterate to the fixed point.
	for range 4 {
		n := uint64(HeaderLen+4+len(gtidBodyOf(g, flags))) + uint64(totalLen(body))
		if n == g.Length {
			break
		}
		g.Length = n
	}
	cur := s.current()
	cur.events = append(cur.events, storedEvent{raw: s.enc.GTIDEvent(g, flags), gtid: key})
	if err := s.writeBody(cur, txn); err != nil {
		return "", err
	}
	if key != nil {
		s.executed.AddGTIDWithTag(key.sid, key.tag, key.gno)
	}
	s.notify()
	if key == nil {
		return "", nil
	}
	return gtidString(*key), nil
}

func gtidString(k gtidKey) string {
	if t := k.tag.String(); t != "" {
		return fmt.Sprintf("%s:%s:%d", k.sid, t, k.gno)
	}
	return fmt.Sprintf("%s:%d", k.sid, k.gno)
}

func totalLen(evs [][]byte) int {
	n := 0
	for _, e := range evs {
		n += len(e)
	}
	return n
}

// txnBody writes the events after the GTID event with a scratch encoder.
func (s *Server) txnBody(txn Txn) ([][]byte, error) {
	scratch := &Encoder{ServerID: s.cfg.ServerID, ThreadID: 8, Time: s.enc.Time, pos: s.enc.pos}
	return txnEvents(scratch, txn, s.xid)
}

// writeBody writes the events after the GTID event into the file.
func (s *Server) writeBody(f *binlogFile, txn Txn) error {
	evs, err := txnEvents(s.enc, txn, s.xid)
	if err != nil {
		return err
	}
	for _, e := range evs {
		f.events = append(f.events, storedEvent{raw: e})
	}
	return nil
}

// txnEvents are a transaction's events after its GTID event.
func txnEvents(enc *Encoder, txn Txn, xid uint64) ([][]byte, error) {
	enc.ThreadID = 8
	if txn.Query != "" {
		return [][]byte{enc.Query(txn.Table.Schema, txn.Query)}, nil
	}
	if !txn.Compressed {
		rows, err := enc.WriteRows(txn.Table, true, txn.Rows...)
		if err != nil {
			return nil, err
		}
		return [][]byte{enc.Query(txn.Table.Schema, "BEGIN"), enc.TableMap(txn.Table), rows, enc.XID(xid)}, nil
	}
	scratch := &Encoder{ServerID: enc.ServerID, ThreadID: enc.ThreadID, Time: enc.Time}
	rows, err := scratch.WriteRows(txn.Table, true, txn.Rows...)
	if err != nil {
		return nil, err
	}
	inner := NewInner(enc.ServerID).Of(scratch.Query(txn.Table.Schema, "BEGIN"), scratch.TableMap(txn.Table), rows, scratch.XID(xid))
	payload, err := enc.Payload(inner...)
	if err != nil {
		return nil, err
	}
	return [][]byte{payload}, nil
}

// Executed is @@gtid_executed.
func (s *Server) Executed() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executed.String()
}

// SetExecuted replaces @@gtid_executed (a failed-over server that lacks
// transactions).
func (s *Server) SetExecuted(set string) error { return s.setGTIDs(&s.executed, set) }

// SetPurged sets @@gtid_purged.
func (s *Server) SetPurged(set string) error { return s.setGTIDs(&s.purged, set) }

// setGTIDs parses set and stores it in *dst under s.mu.
func (s *Server) setGTIDs(dst **mysql.MysqlGTIDSet, set string) error {
	parsed, err := mysql.ParseMysqlGTIDSet(set)
	if err != nil {
		return fmt.Errorf("mysql double: GTID set %q: %w", set, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	*dst = parsed.(*mysql.MysqlGTIDSet)
	return nil
}
