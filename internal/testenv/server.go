package testenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/internal/progress"
)

// Bounds of the waits on a private server. They are limits for conditions that
// are polled, not sleeps: a healthy server answers within about a second on
// a quiet machine; the start's bound is progress.Patience, so that a machine
// busy with a whole test suite never fails it.
const (
	readyTimeout    = progress.Patience // start → first successful ping
	stopTimeout     = 60 * time.Second  // SIGTERM → exit, then SIGKILL
	killTimeout     = 30 * time.Second  // SIGKILL → exit
	installTimeout  = progress.Patience // mariadb-install-db
	pollInterval    = 20 * time.Millisecond
	logTailLines    = 30
	startAttempts   = 3 // fresh ports tried when the chosen one was taken meanwhile
	minAutoServerID = 1_000_000
	maxAutoServerID = 2_000_000_000
)

// ServerOptions configures StartServer.
type ServerOptions struct {
	// ServerID is the server's @@server_id; 0 picks a random one in
	// [1000000, 2000000000), above the ids ServerID hands binlog clients.
	ServerID uint32
	// NoBinlog starts the server with the binlog off (preflight tests).
	NoBinlog bool
	// ExtraArgs are extra mariadbd command-line options, placed after the
	// defaults file so they override it, e.g. "--binlog-format=STATEMENT".
	ExtraArgs []string
	// TLS, if set, makes the server offer TLS (ssl-ca, ssl-cert, ssl-key)
	// with a certificate this CA issues for 127.0.0.1 and localhost. The
	// harness's own connections then use TLS and verify it.
	TLS *CA
	// RequireSecureTransport (with TLS) refuses TCP connections without
	// TLS: require_secure_transport=ON.
	RequireSecureTransport bool
}

// Server is a private mariadbd owned by the test binary: its own datadir, port
// and socket in a temporary directory, root without a password, reachable over
// TCP on 127.0.0.1. Binlog on (unless NoBinlog): log-bin=mariadb-bin, ROW, FULL
// row image and row metadata, GTID strict mode, log-slave-updates; utf8mb4.
//
// A Server's methods are safe for concurrent use. Kill, Start and Stop may be
// repeated in any order; the datadir and port stay the same.
type Server struct {
	dir      string // temporary directory holding everything of this server
	cnf      string // the defaults file
	errLog   string // mariadbd's error log
	outLog   string // mariadbd's stdout and stderr
	mariadbd string
	serverID uint32
	opts     ServerOptions
	shared   bool        // the shared server of MySQL: others' databases live here
	tls      *tls.Config // the harness's client TLS when opts.TLS is set
	cert     *Cert       // the server's certificate when opts.TLS is set

	mu   sync.Mutex
	port int
	proc *process // nil before the first start
}

// process is one run of mariadbd.
type process struct {
	cmd  *exec.Cmd
	out  *os.File
	done chan struct{} // closed once the process has exited and err is set
	err  error
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// errMissing marks an error caused by software that is not installed; tests
// skip on it unless Require.
var errMissing = errors.New("not installed")

// StartServer starts a private binlog-enabled mariadbd just for this test
// (kill, restart, purge and replica tests) and waits until it answers. It is
// stopped and its directory removed at cleanup, also when the test fails.
// When mariadbd or mariadb-install-db is missing the test is skipped, or
// fails under Require.
func StartServer(t testing.TB, opts ServerOptions) *Server {
	t.Helper()
	s, err := newServer(opts)
	if err != nil {
		if errors.Is(err, errMissing) {
			unavailable(t, "cannot start a private MariaDB: %v", err)
		}
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("testenv: tail of %s (server %s):\n%s", s.errLog, s.Addr(), s.logTail())
		}
		if err := s.destroy(); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return s
}

// newServer creates, initialises and starts a server. On error nothing is left
// behind.
func newServer(opts ServerOptions) (_ *Server, err error) {
	mariadbd, err := lookBinary("mariadbd")
	if err != nil {
		return nil, fmt.Errorf("%w: %v (Debian package mariadb-server)", errMissing, err)
	}
	installDB, err := lookBinary("mariadb-install-db")
	if err != nil {
		return nil, fmt.Errorf("%w: %v (Debian package mariadb-server)", errMissing, err)
	}
	dir, err := os.MkdirTemp(ScratchDir(), fmt.Sprintf("%s%d-", serverDirPrefix, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("create server directory: %w", err)
	}
	s := &Server{
		dir:      dir,
		cnf:      filepath.Join(dir, "my.cnf"),
		errLog:   filepath.Join(dir, "error.log"),
		outLog:   filepath.Join(dir, "mariadbd.out"),
		mariadbd: mariadbd,
		serverID: opts.ServerID,
		opts:     opts,
	}
	defer func() {
		if err != nil {
			_ = s.destroy()
		}
	}()
	if s.serverID == 0 {
		s.serverID = randomServerID()
	}
	if opts.RequireSecureTransport && opts.TLS == nil {
		return nil, errors.New("ServerOptions.RequireSecureTransport needs ServerOptions.TLS")
	}
	if opts.TLS != nil {
		if s.cert, err = opts.TLS.issue([]string{"127.0.0.1", "localhost"}); err != nil {
			return nil, fmt.Errorf("issue the server certificate: %w", err)
		}
		s.tls = opts.TLS.ClientTLS("127.0.0.1")
	}
	for _, d := range []string{"data", "tmp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("create server directory: %w", err)
		}
	}
	if err := s.pickPort(); err != nil {
		return nil, err
	}
	if err := s.installFromTemplate(installDB); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		err = s.start()
		if err == nil {
			return s, nil
		}
		if attempt == startAttempts || !strings.Contains(s.logTail(), "already in use") {
			return nil, err
		}
		// Another process took the port between our probe and the server's
		// bind: take a fresh one.
		if err := s.pickPort(); err != nil {
			return nil, err
		}
	}
}

func randomServerID() uint32 {
	return uint32(minAutoServerID + rand.IntN(maxAutoServerID-minAutoServerID))
}

// pickPort chooses a free TCP port on 127.0.0.1 and rewrites the defaults file.
func (s *Server) pickPort() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return fmt.Errorf("find a free port: %w", err)
	}
	s.mu.Lock()
	s.port = port
	s.mu.Unlock()
	return s.writeConfig()
}

// writeConfig writes the defaults file. It is passed first on every command
// line so that no system option file is read.
func (s *Server) writeConfig() error {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("[mysqld]")
	w("user=root")
	w("datadir=%s", filepath.Join(s.dir, "data"))
	w("tmpdir=%s", filepath.Join(s.dir, "tmp"))
	w("socket=%s", filepath.Join(s.dir, "mysqld.sock"))
	w("pid-file=%s", filepath.Join(s.dir, "mysqld.pid"))
	w("log-error=%s", s.errLog)
	w("port=%d", s.Port())
	w("bind-address=127.0.0.1")
	w("skip-name-resolve")
	w("server-id=%d", s.serverID)
	if !s.opts.NoBinlog {
		w("log-bin=mariadb-bin")
		w("log-slave-updates=ON")
	}
	w("binlog-format=ROW")
	w("binlog-row-image=FULL")
	w("binlog-row-metadata=FULL")
	w("gtid-strict-mode=ON")
	// Without these a private defaults file falls back to latin1.
	w("character-set-server=utf8mb4")
	w("collation-server=utf8mb4_unicode_ci")
	w("innodb-buffer-pool-size=64M")
	w("innodb-log-file-size=16M")
	// Survives kill -9 (the OS keeps the writes); only a machine crash loses them.
	w("innodb-flush-log-at-trx-commit=2")
	w("performance-schema=OFF")
	w("max-connections=500")
	if s.cert != nil {
		w("ssl-ca=%s", s.opts.TLS.CertFile)
		w("ssl-cert=%s", s.cert.CertFile)
		w("ssl-key=%s", s.cert.KeyFile)
		if s.opts.RequireSecureTransport {
			w("require-secure-transport=ON")
		}
	}
	if err := os.WriteFile(s.cnf, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", s.cnf, err)
	}
	return nil
}

// install initialises the datadir with mariadb-install-db.
func (s *Server) install(installDB string) error {
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, installDB,
		"--defaults-file="+s.cnf,
		"--auth-root-authentication-method=normal",
		"--skip-test-db",
		"--user=root",
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	_ = os.WriteFile(filepath.Join(s.dir, "install.log"), out, 0o600)
	if err != nil {
		return fmt.Errorf("initialise datadir with %s: %w\n%s\n%s", installDB, err, tail(out, logTailLines), s.logTail())
	}
	return nil
}

// datadirTemplate is the test binary's initialised datadir: mariadb-install-db
// runs once per binary, into it, and each new server gets a copy (about a
// second of two CPUs saved per server). The datadir holds nothing of the
// options a server starts with (port, server id, binlog, TLS, InnoDB sizes:
// a larger redo log is made at the first start, as it was after an install
// of its own), so one template serves every server. Main removes it.
var datadirTemplate struct {
	once sync.Once
	srv  *Server // its directory holds data/, the template; never started
	err  error
}

// installFromTemplate fills s's empty data directory with a copy of the
// binary's template, made first with installDB when there is none yet.
func (s *Server) installFromTemplate(installDB string) error {
	datadirTemplate.once.Do(func() {
		datadirTemplate.srv, datadirTemplate.err = newTemplate(installDB)
	})
	if datadirTemplate.err != nil {
		return datadirTemplate.err
	}
	if err := copyTree(filepath.Join(datadirTemplate.srv.dir, "data"), filepath.Join(s.dir, "data")); err != nil {
		return fmt.Errorf("copy the datadir template: %w", err)
	}
	return nil
}

// newTemplate initialises a datadir with installDB in a directory of its own,
// named like a server's so that removeStaleDirs finds it when the binary was
// killed.
func newTemplate(installDB string) (_ *Server, err error) {
	dir, err := os.MkdirTemp(ScratchDir(), fmt.Sprintf("%s%d-template-", serverDirPrefix, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("create the datadir template's directory: %w", err)
	}
	t := &Server{dir: dir, cnf: filepath.Join(dir, "my.cnf"), errLog: filepath.Join(dir, "error.log"),
		outLog: filepath.Join(dir, "mariadbd.out"), serverID: randomServerID()}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	for _, d := range []string{"data", "tmp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("create the datadir template's directory: %w", err)
		}
	}
	if err := t.pickPort(); err != nil {
		return nil, err
	}
	if err := t.install(installDB); err != nil {
		return nil, err
	}
	return t, nil
}

// removeTemplate removes the datadir template, if one was made.
func removeTemplate() error {
	datadirTemplate.once.Do(func() { datadirTemplate.err = errors.New("testenv: the tests have finished") })
	if datadirTemplate.srv == nil {
		return nil
	}
	return os.RemoveAll(datadirTemplate.srv.dir)
}

// copyTree copies the files and directories under from into the existing
// directory to, with their permissions.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil || rel == "." {
			return err
		}
		dst := filepath.Join(to, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.Mkdir(dst, info.Mode().Perm())
		}
		if !info.Mode().IsRegular() {
			return fmt.Errorf("%s: not a regular file", path)
		}
		return copyFile(path, dst, info.Mode().Perm())
	})
}

func copyFile(from, to string, perm os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// start runs mariadbd and waits until it answers. The server must not be running.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil && !s.proc.exited() {
		return fmt.Errorf("start mariadbd on %s: already running (pid %d)", s.addrLocked(), s.proc.cmd.Process.Pid)
	}
	out, err := os.OpenFile(s.outLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("start mariadbd: open %s: %w", s.outLog, err)
	}
	args := append([]string{"--defaults-file=" + s.cnf}, s.opts.ExtraArgs...)
	cmd := exec.Command(s.mariadbd, args...)
	cmd.Stdout, cmd.Stderr = out, out
	// The server dies with the test binary even when that is killed (e.g. by
	// the go test timeout) before any cleanup could run. (Pdeathsig follows the
	// forking OS thread, which the Go runtime only ends when a goroutine exits
	// while locked to it; test code does not do that.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("start %s: %w", s.mariadbd, err)
	}
	p := &process{cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	s.proc = p
	if err := s.waitReady(p); err != nil {
		s.killLocked()
		return err
	}
	return nil
}

// waitReady polls until the server answers a ping, the process exits or
// readyTimeout passes.
func (s *Server) waitReady(p *process) error {
	cfg := configAt(s.addrLocked(), "")
	cfg.TLS = s.tls
	cfg.Timeout = time.Second
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return fmt.Errorf("wait for mariadbd: %w", err)
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var lastErr error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		lastErr = db.PingContext(ctx)
		cancel()
		if lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mariadbd on %s did not answer within %v: %v\ntail of %s:\n%s",
				s.addrLocked(), readyTimeout, lastErr, s.errLog, s.logTail())
		}
		select {
		case <-p.done:
			return fmt.Errorf("mariadbd on %s exited during start-up (%v)\ntail of %s:\n%s",
				s.addrLocked(), p.err, s.errLog, s.logTail())
		case <-tick.C:
		}
	}
}

// killLocked sends SIGKILL and waits for the exit. s.mu must be held.
func (s *Server) killLocked() error {
	p := s.proc
	if p == nil || p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill mariadbd on %s: %w", s.addrLocked(), err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("kill mariadbd on %s: still running %v after SIGKILL", s.addrLocked(), killTimeout)
	}
}

// stopLocked shuts the server down cleanly (SIGTERM), falling back to SIGKILL
// after stopTimeout. s.mu must be held.
func (s *Server) stopLocked() error {
	p := s.proc
	if p == nil || p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop mariadbd on %s: %w", s.addrLocked(), err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
		if err := s.killLocked(); err != nil {
			return err
		}
		return fmt.Errorf("stop mariadbd on %s: no exit within %v of SIGTERM, killed\ntail of %s:\n%s",
			s.addrLocked(), stopTimeout, s.errLog, s.logTail())
	}
}

// destroy kills the server (its data is thrown away, so there is nothing to
// shut down cleanly) and removes its directory.
func (s *Server) destroy() error {
	s.mu.Lock()
	err := s.killLocked()
	s.mu.Unlock()
	if rmErr := os.RemoveAll(s.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("remove server directory: %w", rmErr))
	}
	return err
}

// running reports whether the server process is up (it may still be starting).
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.proc.exited()
}

// logTail returns the last lines of the error log and of mariadbd's output.
func (s *Server) logTail() string {
	var b strings.Builder
	for _, f := range []string{s.errLog, s.outLog} {
		data, err := os.ReadFile(f)
		if err != nil || len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		b.WriteString(tail(data, logTailLines))
	}
	return b.String()
}

func tail(data []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}

// Host returns the address the server listens on: 127.0.0.1.
func (s *Server) Host() string { return "127.0.0.1" }

// Port returns the server's TCP port; it stays the same across Kill and Start.
func (s *Server) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.port
}

// Addr returns host:port.
func (s *Server) Addr() string { return net.JoinHostPort(s.Host(), strconv.Itoa(s.Port())) }

func (s *Server) addrLocked() string { return net.JoinHostPort(s.Host(), strconv.Itoa(s.port)) }

// ServerID returns the server's @@server_id.
func (s *Server) ServerID() uint32 { return s.serverID }

// Dir returns the directory holding the server's datadir, defaults file and logs.
func (s *Server) Dir() string { return s.dir }

// ErrorLog returns the path of the server's error log.
func (s *Server) ErrorLog() string { return s.errLog }

// config is the go-sql-driver configuration for root on database db ("" for
// none), with TLS on a TLS server. configAt is the same for a given address,
// without TLS.
func (s *Server) config(db string) *mysql.Config {
	cfg := configAt(s.Addr(), db)
	if s.tls != nil {
		cfg.TLS = s.tls.Clone()
	}
	return cfg
}

func configAt(addr, db string) *mysql.Config {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net = "tcp"
	cfg.Addr = addr
	cfg.DBName = db
	cfg.MultiStatements = true
	cfg.Timeout = 10 * time.Second
	return cfg
}

// DSN returns the go-sql-driver DSN of root on database db ("" for none), with
// multiStatements=true and without parseTime. A DSN has no room for a CA: on a
// TLS server it carries no tls parameter, and the caller adds one (or the
// relay's --mysql-tls-ca).
func (s *Server) DSN(db string) string { return s.config(db).FormatDSN() }

// TLSConfig is the client TLS configuration the harness uses on a TLS server
// (trusting ServerOptions.TLS, verifying 127.0.0.1); nil on a plain one.
func (s *Server) TLSConfig() *tls.Config {
	if s.tls == nil {
		return nil
	}
	return s.tls.Clone()
}

// Root returns a pool connected to the server as root without a default
// database (over TLS on a TLS server). It is closed at cleanup.
func (s *Server) Root(t testing.TB) *sql.DB {
	t.Helper()
	connector, err := mysql.NewConnector(s.config(""))
	if err != nil {
		t.Fatalf("testenv: open root pool on %s: %v", s.Addr(), err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { db.Close() })
	return db
}

// Kill sends SIGKILL to the server and waits until the process has exited.
// A server that is not running is left alone.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.mustBeOwn(t, "Kill")
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.killLocked(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Start starts the server again on the same datadir and port and waits until
// it answers (after crash recovery when it was killed). The server must not be
// running.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	s.mustBeOwn(t, "Start")
	if err := s.start(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Stop shuts the server down cleanly and waits until it has exited. A server
// that is not running is left alone.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.mustBeOwn(t, "Stop")
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// mustBeOwn refuses operations that would disturb the other tests using the
// shared server.
func (s *Server) mustBeOwn(t testing.TB, op string) {
	t.Helper()
	if s.shared {
		t.Fatalf("testenv: %s on the shared server of testenv.MySQL would disturb other tests; use testenv.StartServer for a server of your own", op)
	}
}
