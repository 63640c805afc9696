package mysqldouble

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
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
	changed  chan struct{} // closed at each append
	conns    map[net.Conn]*clientConn
	xid      uint64
	closed   bool
	now      time.Time // the time of the events written from now on (SetTime); zero: NewEncoder's

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
