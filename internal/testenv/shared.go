package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// shared is the harness's one piece of process state: the private mariadbd
// that MySQL hands out databases on, and the RabbitMQ cluster of
// SharedRabbitCluster, each started on first use and stopped by Main after
// the tests of the binary have run.
var shared struct {
	main atomic.Bool // Main is running the tests: someone will stop the server
	once sync.Once   // starts the server
	srv  *Server     // set by once
	err  error       // set by once

	clusterOnce sync.Once      // starts the RabbitMQ cluster (SharedRabbitCluster)
	cluster     *RabbitCluster // set by clusterOnce
	clusterErr  error          // set by clusterOnce
}

// Main wraps TestMain: it runs the tests, then stops the shared private server
// this test binary started (if any) and removes its directory. Its result is
// the exit code for os.Exit:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
//
// Before the tests it also removes the directories that private servers of
// test binaries no longer running left behind (a binary killed by the go test
// timeout runs no cleanup; its servers die with it, their directories stay).
func Main(m *testing.M) int {
	removeStaleDirs()
	shared.main.Store(true)
	code := m.Run()
	shared.once.Do(func() {}) // no start from now on; makes srv safe to read
	if shared.srv != nil {
		if err := shared.srv.destroy(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: stop the shared MariaDB: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	if err := removeTemplate(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: remove the datadir template: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	shared.clusterOnce.Do(func() {})
	if shared.cluster != nil {
		if err := shared.cluster.destroy(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: stop the RabbitMQ cluster: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
		shared.cluster = nil
	}
	return code
}

// MySQL gives the test a fresh empty database (name derived from the test
// name plus a random suffix, utf8mb4) on a binlog-enabled server: the shared
// private mariadbd of this test binary, started on first use (the test
// package's TestMain must call Main, which stops it), or the external server of
// OUTBOX_TEST_MYSQL_DSN when that is set. The database is dropped at cleanup.
//
// The shared server is used by every test of the binary at once: a test that
// kills, restarts, purges or reconfigures a server uses StartServer instead
// (Kill, Start, Stop and PurgeBinlogs refuse to act on the shared server).
func MySQL(t testing.TB) *DB {
	t.Helper()
	if dsn := os.Getenv(EnvMySQLDSN); dsn != "" {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatalf("testenv: %s: %v", EnvMySQLDSN, err)
		}
		cfg.DBName = ""
		return createDatabase(t, nil, cfg)
	}
	if !shared.main.Load() {
		t.Fatalf("testenv: MySQL needs the package's TestMain to run the tests through testenv.Main, which stops the shared server:\n\tfunc TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }")
	}
	shared.once.Do(func() {
		shared.srv, shared.err = newServer(ServerOptions{})
		if shared.srv != nil {
			shared.srv.shared = true
		}
	})
	if shared.err != nil {
		if errors.Is(shared.err, errMissing) {
			unavailable(t, "cannot start a private MariaDB: %v", shared.err)
		}
		t.Fatalf("testenv: start the shared MariaDB: %v", shared.err)
	}
	if shared.srv == nil {
		t.Fatalf("testenv: MySQL called after testenv.Main finished the tests")
	}
	return shared.srv.CreateDatabase(t)
}

// serverDirPrefix starts the name of every private server's directory in
// ScratchDir(); the owning test binary's pid follows, then "-".
const serverDirPrefix = "outbox-testenv-"

// memoryDir is where ScratchDir puts servers when it can: a tmpfs, so that the
// datadirs, binlogs and queue files of a whole suite cost no disk I/O (a
// killed server loses nothing there either: its writes are in the OS).
const memoryDir = "/dev/shm"

// ScratchDir is the directory private servers keep their files in: memoryDir
// when it is a writable directory, else os.TempDir().
func ScratchDir() string {
	if fi, err := os.Stat(memoryDir); err == nil && fi.IsDir() && syscall.Access(memoryDir, 2 /* W_OK */) == nil {
		return memoryDir
	}
	return os.TempDir()
}

// removeStaleDirs removes server directories whose owning process is gone.
func removeStaleDirs() {
	dirs, err := filepath.Glob(filepath.Join(ScratchDir(), serverDirPrefix+"*"))
	if err != nil {
		return
	}
	for _, dir := range dirs {
		pidText, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(dir), serverDirPrefix), "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(dir)
		}
	}
}
