package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Environment variables read by the harness.
const (
	// EnvRequire set to 1 makes a missing service a test failure instead of a skip.
	EnvRequire = "OUTBOX_REQUIRE_INTEGRATION"
	// EnvMySQLDSN names an external binlog-enabled server (go-sql-driver DSN, any
	// database part is ignored) that MySQL uses instead of the shared private one.
	EnvMySQLDSN = "OUTBOX_TEST_MYSQL_DSN"
	// EnvAMQPURL names the RabbitMQ broker; default DefaultAMQPURL.
	EnvAMQPURL = "OUTBOX_TEST_AMQP_URL"
)

// DefaultAMQPURL is the broker RabbitMQ uses when EnvAMQPURL is unset.
const DefaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

const howToRun = "`make test` installs and starts MariaDB and RabbitMQ (scripts/ensure-services.sh)"

// Require reports whether integration tests must fail rather than skip when a
// service they need is missing (OUTBOX_REQUIRE_INTEGRATION=1).
func Require() bool { return os.Getenv(EnvRequire) == "1" }

// unavailable ends the test because a service is missing: t.Fatal when Require,
// t.Skip otherwise; the message says what is missing and how to provide it.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Require() {
		t.Fatalf("testenv: %s (%s=1 forbids skipping)", msg, EnvRequire)
	}
	t.Skipf("testenv: %s; skipping (%s; set %s=1 to fail instead)", msg, howToRun, EnvRequire)
}

// lookBinary finds a program on PATH or in the sbin directories, which are
// often not on a non-root PATH.
func lookBinary(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH or in /usr/sbin, /usr/local/sbin", name)
}

// Context is a context for one short step of a test (a migration, a
// connection, a statement), ended after d or when the test ends, whichever
// comes first. A workload gets WorkContext instead: a fixed time for a whole
// workload fails a test because the machine is slow.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// workMargin is what WorkContext leaves of the test binary's -timeout for the
// test to report its failure and clean up.
const workMargin = 30 * time.Second

// WorkContext is the context of a test's workload: it ends when the test ends,
// or workMargin before the test binary's -timeout, never after a fixed time of
// its own. The waits inside it are bounded by progress (package progress,
// validator.WaitComplete, testload.WaitRows): they fail when nothing has moved
// for progress.Patience, however long the whole workload takes.
func WorkContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, set := d.Deadline(); set {
			ctx, cancel = context.WithDeadline(context.Background(), deadline.Add(-workMargin))
		}
	}
	t.Cleanup(cancel)
	return ctx
}
