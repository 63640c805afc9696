package mysqldouble

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-mysql-org/go-mysql/server"
	"github.com/google/uuid"
)

// Version is the MySQL release a Server answers as.
type Version struct {
	Name           string // VERSION()
	Number         uint32 // immediate_server_version in GTID events
	PostHeaderLens []byte // the FORMAT_DESCRIPTION's table
	// Removed84 is MySQL 8.4: SHOW MASTER STATUS, SHOW SLAVE HOSTS and the
	// other MASTER/SLAVE statements are syntax errors.
	Removed84 bool
}

// The releases the double answers as.
var (
	MySQL80 = Version{Name: "8.0.40", Number: 80040, PostHeaderLens: PostHeaderLens80}
	MySQL84 = Version{Name: "8.4.3", Number: 80403, PostHeaderLens: PostHeaderLens84, Removed84: true}
)

// Config is a Server's identity and account.
type Config struct {
	Version        Version
	User, Password string      // the one account (caching_sha2_password)
	TLS            *tls.Config // offered to clients when set
	ServerUUID     uuid.UUID   // @@server_uuid: the SID of its GTIDs
	ServerID       uint32      // @@server_id
	// Variables override the global variables the double answers (names
	// as in @@GLOBAL.name: log_bin, binlog_format, binlog_row_image,
	// binlog_row_metadata, gtid_mode); unset ones answer what the relay
	// wants (1, ROW, FULL, FULL, ON).
	Variables map[string]string
	// GTIDModeOff is gtid_mode=OFF: every transaction is anonymous, and
	// replicas dump by file and offset (COM_BINLOG_DUMP).
	GTIDModeOff bool
	// Grants are SHOW GRANTS' lines; nil: REPLICATION SLAVE and
	// REPLICATION CLIENT on *.*, as docs/operations.md tells users to grant.
	Grants []string
}

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

// Server is a MySQL-shaped test double: it speaks the client protocol
// (go-mysql's server package), answers the statements the relay's
// preflight and position reads make as Config.Version does, and serves
// COM_BINLOG_DUMP_GTID from binlog files it writes with Encoder, to which a
// test appends transactions while dumps are live. Close stops it and
// every goroutine it started.
type Server struct {
	cfg Config
	ln  net.Listener
	srv *server.Server

	mu       sync.Mutex
	files    []*binlogFile
	enc      *Encoder
	executed *mysql.MysqlGTIDSet
	purged   *mysql.MysqlGTIDSet
	override map[string]*mysql.Result // query answers a test set
	errs     map[string]error         // query errors a test set
	changed  chan struct{}            // closed at each append
	conns    map[net.Conn]*clientConn
	xid      uint64
	closed   bool

	wg sync.WaitGroup
}

// Start listens on 127.0.0.1 at a free port and serves until Close.
func Start(cfg Config) (*Server, error) {
	if cfg.Version.Name == "" {
		cfg.Version = MySQL84
	}
	if cfg.ServerID == 0 {
		cfg.ServerID = 1
	}
	if cfg.Grants == nil {
		cfg.Grants = []string{fmt.Sprintf("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `%s`@`%%`", cfg.User)}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("mysql double: listen: %w", err)
	}
	// MySQL 8.4's default authentication; without TLS the client fetches
	// the server's RSA key for the full authentication (1024 bits: a test
	// key, made fast).
	key, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("mysql double: RSA key: %w", err)
	}
	empty := mysql.NewMysqlGTIDSet()
	purged := mysql.NewMysqlGTIDSet()
	s := &Server{
		cfg: cfg, ln: ln,
		srv:      server.NewServer(cfg.Version.Name, mysql.DEFAULT_COLLATION_ID, mysql.AUTH_CACHING_SHA2_PASSWORD, key, cfg.TLS),
		executed: &empty, purged: &purged,
		override: map[string]*mysql.Result{}, errs: map[string]error{},
		changed: make(chan struct{}), conns: map[net.Conn]*clientConn{},
	}
	s.newFile()
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// clientConn is a client connection's id (0 before the handshake) and
// the cancel of its context, which ends its dump.
type clientConn struct {
	id     uint32
	cancel context.CancelFunc
}

// drop closes c and ends its dump. s.mu held.
func (s *Server) drop(c net.Conn) {
	_ = c.Close()
	s.conns[c].cancel()
}

// Addr is host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Port is the listening port.
func (s *Server) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Close stops listening, drops every connection and waits for the
// goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		s.drop(c)
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// kill closes the connection of id (KILL id), as go-mysql's syncer asks
// when it closes.
func (s *Server) kill(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c, cc := range s.conns {
		if strconv.FormatUint(uint64(cc.id), 10) == id {
			s.drop(c)
			return nil
		}
	}
	return mysql.NewError(mysql.ER_NO_SUCH_THREAD, "Unknown thread id: "+id)
}

// DropConnections closes every client connection (a server restart or a
// network cut, as the relay sees it); the binlog stays.
func (s *Server) DropConnections() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		s.drop(c)
	}
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		s.conns[c] = &clientConn{cancel: cancel}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(ctx, c)
	}
}

// serve runs one client connection until it closes or ctx ends.
func (s *Server) serve(ctx context.Context, c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		s.drop(c)
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	h := &session{s: s, ctx: ctx}
	conn, err := s.srv.NewConn(c, s.cfg.User, s.cfg.Password, h)
	if err != nil {
		return
	}
	s.mu.Lock()
	s.conns[c].id = conn.ConnectionID()
	s.mu.Unlock()
	for !conn.Closed() {
		if err := conn.HandleCommand(); err != nil {
			return
		}
	}
}

// newFile starts the next binlog file: FORMAT_DESCRIPTION, then
// PREVIOUS_GTIDS with the executed set. s.mu held (or not yet shared).
func (s *Server) newFile() {
	name := fmt.Sprintf("binlog.%06d", len(s.files)+1)
	s.enc = NewEncoder(s.cfg.ServerID)
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
	g := GTID{CommitTime: time.Unix(1700000000, 0), ServerVersion: s.cfg.Version.Number}
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
	body, err := s.txnBody(txn, g.ServerVersion)
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
func (s *Server) txnBody(txn Txn, _ uint32) ([][]byte, error) {
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

// Answer makes the server answer query (as the client sends it) with
// columns and rows instead of its own answer.
func (s *Server) Answer(query string, columns []string, rows ...[]any) error {
	rs, err := mysql.BuildSimpleTextResultset(columns, rows)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.override[normalize(query)] = &mysql.Result{Resultset: rs}
	return nil
}

// Fail makes the server answer query with err (a *mysql.MyError).
func (s *Server) Fail(query string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs[normalize(query)] = err
}

func normalize(q string) string {
	return strings.ToUpper(strings.Join(strings.Fields(strings.TrimSuffix(strings.TrimSpace(q), ";")), " "))
}

// errParse is MySQL's answer to a statement it does not know.
func errParse(q string) error {
	return mysql.NewError(mysql.ER_PARSE_ERROR, fmt.Sprintf(
		"You have an error in your SQL syntax; check the manual that corresponds to your MySQL server version for the right syntax to use near '%s' at line 1", q))
}

// heartbeatPeriod parses SET @master_heartbeat_period = N (nanoseconds).
func heartbeatPeriod(q string) (time.Duration, bool) {
	const key = "@MASTER_HEARTBEAT_PERIOD ="
	i := strings.Index(q, key)
	if i < 0 {
		return 0, false
	}
	rest := strings.TrimSpace(q[i+len(key):])
	if j := strings.IndexAny(rest, ", "); j >= 0 {
		rest = rest[:j]
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(n), true
}

// dumpStart is where a dump starts: a file and the index of its first
// event to send (a FORMAT_DESCRIPTION is always sent first).
type dumpStart struct {
	file, event int
}

// startAt finds the event at offset pos of the named file.
func (s *Server) startAt(name string, pos uint32) (dumpStart, error) {
	for i, f := range s.files {
		if f.name != name {
			continue
		}
		off := uint32(4)
		for j, ev := range f.events {
			if off == pos {
				return dumpStart{i, j}, nil
			}
			off += uint32(len(ev.raw))
		}
		if off == pos {
			return dumpStart{i, len(f.events)}, nil
		}
	}
	return dumpStart{}, mysql.NewError(mysql.ER_MASTER_FATAL_ERROR_READING_BINLOG,
		fmt.Sprintf("Could not find first log file name in binary log index file (%s:%d)", name, pos))
}

// stream sends the binlog from start on, skipping the transactions in
// have (nil: none), then waits for more, sending heartbeats every period,
// until ctx ends (the connection closed).
func (s *Server) stream(ctx context.Context, st *replication.BinlogStreamer, start dumpStart, have *mysql.MysqlGTIDSet, period time.Duration) {
	defer s.wg.Done()
	// Every return ends the connection's writeBinlogEvents, which waits
	// for the next event otherwise.
	defer st.AddErrorToStreamer(errors.New("dump ended"))
	send := func(raw []byte) bool {
		select {
		case <-ctx.Done():
			return false
		default:
		}
		return st.AddEventToStreamer(&replication.BinlogEvent{RawData: raw}) == nil
	}
	s.mu.Lock()
	f := s.files[start.file]
	pos := uint64(4)
	for _, ev := range f.events[:start.event] {
		pos += uint64(len(ev.raw))
	}
	fde := f.events[0].raw
	s.mu.Unlock()
	if !send(FakeRotate(s.cfg.ServerID, f.name, pos)) || start.event > 0 && !send(fde) {
		return
	}
	fileIdx, evIdx, skipping := start.file, start.event, false
	for {
		s.mu.Lock()
		var batch [][]byte
		for fileIdx < len(s.files) {
			f := s.files[fileIdx]
			for ; evIdx < len(f.events); evIdx++ {
				ev := f.events[evIdx]
				if ev.gtid != nil {
					skipping = have != nil && have.Contain(single(*ev.gtid))
				} else if ev.raw[4] == byte(replication.ANONYMOUS_GTID_EVENT) {
					skipping = false
				}
				if skipping && ev.raw[4] != byte(replication.ROTATE_EVENT) {
					continue
				}
				batch = append(batch, ev.raw)
			}
			if !f.closed {
				break
			}
			fileIdx, evIdx = fileIdx+1, 0
		}
		changed := s.changed
		hb := s.enc.Heartbeat(s.current().name)
		s.mu.Unlock()
		for _, raw := range batch {
			if !send(raw) {
				return
			}
		}
		var tick <-chan time.Time
		var timer *time.Timer
		if period > 0 {
			timer = time.NewTimer(period)
			tick = timer.C
		}
		stop := func() {
			if timer != nil {
				timer.Stop()
			}
		}
		select {
		case <-ctx.Done():
			stop()
			return
		case <-changed:
			stop()
		case <-tick:
			if !send(hb) {
				return
			}
		}
	}
}

func single(k gtidKey) *mysql.MysqlGTIDSet {
	set := mysql.NewMysqlGTIDSet()
	set.AddGTIDWithTag(k.sid, k.tag, k.gno)
	return &set
}
