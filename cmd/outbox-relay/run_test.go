package main

// Tests of `outbox-relay run` as a subprocess against real servers: the
// binary is built once per test binary, its stderr goes to a file under the
// test's TempDir that is printed when the test fails.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/progress"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testload"
	"github.com/outbox-relay/outbox-relay/internal/validator"
	"github.com/outbox-relay/outbox-relay/outbox"
)

var relayBin struct {
	once sync.Once
	path string
	err  error
}

// relayBinary builds outbox-relay once per test binary, with a version
// stamped in as a release build would; every test runs that one build (a
// build per test cost 5-10 s each on 2 cores). The directory is named like testenv's private server
// directories (testenv.ScratchDir()/outbox-testenv-<pid>-…), so testenv.Main removes
// it at the next run once this process is gone.
func relayBinary(t *testing.T) string {
	t.Helper()
	relayBin.once.Do(func() {
		dir, err := os.MkdirTemp(testenv.ScratchDir(), fmt.Sprintf("outbox-testenv-%d-bin-", os.Getpid()))
		if err != nil {
			relayBin.err = err
			return
		}
		bin := filepath.Join(dir, "outbox-relay")
		cmd := exec.Command("go", "build", "-ldflags", "-X main.version=9.9.9-test", "-o", bin, ".")
		// GOFLAGS as the tests were built (make test: -trimpath, so
		// the build reuses their compiled packages), without VCS stamps.
		cmd.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -buildvcs=false"))
		if out, err := cmd.CombinedOutput(); err != nil {
			relayBin.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		relayBin.path = bin
	})
	if relayBin.err != nil {
		t.Fatal(relayBin.err)
	}
	return relayBin.path
}

// relayProc is one relay subprocess, started and stopped as often as a test
// likes with the same arguments. Output of every start is appended to one
// log file.
type relayProc struct {
	t       *testing.T
	bin     string
	args    []string
	logPath string
	starts  int

	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

func newRelayProc(t *testing.T, args ...string) *relayProc {
	t.Helper()
	p := &relayProc{
		t: t, bin: relayBinary(t), args: append([]string{"run"}, args...),
		logPath: filepath.Join(t.TempDir(), "relay.log"),
	}
	t.Cleanup(func() {
		if p.running() {
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("relay output (%s), last 64 KiB:\n%s", p.logPath, tailFile(p.logPath, 64<<10))
		}
	})
	return p
}

// privateDB gives a test that runs in parallel (t.Parallel) a database on a
// server of its own: a relay's leadership lock, GET_LOCK('outbox-relay:<relay
// name>'), is server-wide, so relays of tests running at once on the shared
// server would contend for one lock (and a test killing the lock's holder
// could hit another test's relay).
func privateDB(t testing.TB) *testenv.DB {
	t.Helper()
	return testenv.StartServer(t, testenv.ServerOptions{}).CreateDatabase(t)
}

// heavyLane admits one test at a time whose workload keeps the cores busy
// by itself (ten thousand messages and more, a 100 MB transaction, the
// bench), beside the parallel tests that mostly wait. Two at once, on two
// cores shared with the rest of the suite, made each slower and have cost
// a relay its lease.
var heavyLane = make(chan struct{}, 1)

// heavy runs t in parallel (t.Parallel) in the heavy lane: it waits for the
// lane, and holds it until t and its cleanup are done.
func heavy(t *testing.T) {
	t.Helper()
	t.Parallel()
	heavyLane <- struct{}{}
	t.Cleanup(func() { <-heavyLane })
}

// relayArgs are the flags of a relay on db publishing to b.
func relayArgs(t testing.TB, db *testenv.DB, b *testenv.Broker, extra ...string) []string {
	return append([]string{
		"--mysql-dsn", db.DSN, "--amqp-url", b.URL, "--default-exchange", b.Exchange,
		"--server-id", strconv.FormatUint(uint64(testenv.ServerID(t)), 10),
		"--checkpoint-interval", "1s", "--log-format", "console", "--metrics-addr", "127.0.0.1:0",
	}, extra...)
}

func (p *relayProc) start() {
	p.t.Helper()
	if p.running() {
		p.t.Fatal("relay already running")
	}
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	defer f.Close() // the child has its own descriptor
	p.starts++
	fmt.Fprintf(f, "=== start #%d at %s\n", p.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start relay: %v", err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	exited := p.exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
}

func (p *relayProc) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// wait waits up to d for the process to exit and returns its exit code (-1
// when killed by a signal); ok is false on timeout.
func (p *relayProc) wait(d time.Duration) (code int, ok bool) {
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode(), true
	case <-time.After(d):
		return 0, false
	}
}

// kill SIGKILLs the process and waits for it.
func (p *relayProc) kill() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	if _, ok := p.wait(30 * time.Second); !ok {
		p.t.Fatal("relay still running 30 s after SIGKILL")
	}
}

// terminate sends SIGTERM and returns the exit code and how long the exit
// took; it fails the test when the process is still running after d (and
// kills it).
func (p *relayProc) terminate(d time.Duration) (int, time.Duration) {
	p.t.Helper()
	began := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	code, ok := p.wait(d)
	if !ok {
		_ = p.cmd.Process.Signal(syscall.SIGQUIT) // goroutine dump into the log
		if _, ok := p.wait(5 * time.Second); !ok {
			p.kill()
		}
		p.t.Fatalf("relay did not exit within %v of SIGTERM", d)
	}
	return code, time.Since(began)
}

// runToExit starts the relay and waits up to d for it to exit by itself.
func (p *relayProc) runToExit(d time.Duration) int {
	p.t.Helper()
	p.start()
	code, ok := p.wait(d)
	if !ok {
		p.kill()
		p.t.Fatalf("relay still running after %v; expected it to exit", d)
	}
	return code
}

// output is everything the relay wrote so far.
func (p *relayProc) output() string {
	data, _ := os.ReadFile(p.logPath)
	return string(data)
}

// lastLine is the last line of the output: the error line of run().
func (p *relayProc) lastLine() string {
	out := strings.TrimRight(p.output(), "\n")
	return out[strings.LastIndexByte(out, '\n')+1:]
}

// waitLog waits until the output of the current start contains s.
func (p *relayProc) waitLog(ctx context.Context, s string) {
	ctx, cancel := progress.Step(ctx)
	defer cancel()
	p.t.Helper()
	marker := fmt.Sprintf("=== start #%d ", p.starts)
	for {
		out := p.output()
		if i := strings.LastIndex(out, marker); i >= 0 && strings.Contains(out[i:], s) {
			return
		}
		if !p.running() {
			p.t.Fatalf("relay exited (code %d) before logging %q", p.cmd.ProcessState.ExitCode(), s)
		}
		select {
		case <-ctx.Done():
			p.t.Fatalf("relay did not log %q: %v", s, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// peakRSS is the process's VmHWM from /proc in bytes.
func (p *relayProc) peakRSS() int64 {
	p.t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		p.t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				p.t.Fatalf("VmHWM %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	p.t.Fatal("no VmHWM in /proc status")
	return 0
}

func tailFile(path string, n int64) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if int64(len(data)) > n {
		data = data[int64(len(data))-n:]
	}
	return string(data)
}

// migrate applies the schema with the binary.
func migrate(t *testing.T, dsn string) {
	t.Helper()
	if r := runBinary(t, relayBinary(t), nil, "migrate", "--mysql-dsn", dsn); r.code != 0 {
		t.Fatalf("migrate: %+v", r)
	}
}

// consumeAll attaches a validator to the broker's queue for the test.
func consumeAll(t *testing.T, b *testenv.Broker) *validator.Validator {
	t.Helper()
	v := validator.New()
	stop, err := validator.Consume(context.Background(), b.URL, b.Queue, v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return v
}

// unique is the number of distinct messages delivered.
func unique(v *validator.Validator) int { return v.Received() - v.Duplicates() }

// waitUnique waits until v has seen n distinct messages; the relay must keep
// running meanwhile.
func waitUnique(ctx context.Context, t *testing.T, v *validator.Validator, p *relayProc, n int) {
	t.Helper()
	exited := false
	err := progress.Wait(ctx, "wait for distinct deliveries", func() int64 { return int64(unique(v)) }, func() bool {
		exited = !p.running()
		return exited || unique(v) >= n
	})
	if exited && unique(v) < n {
		t.Fatalf("relay exited by itself (code %d) at %d distinct deliveries", p.cmd.ProcessState.ExitCode(), unique(v))
	}
	if err != nil {
		t.Fatalf("only %d distinct deliveries, waited for %d: %v", unique(v), n, err)
	}
}

// checkAcknowledged checks, while no relay publishes (stopped, or paused),
// that everything published was acknowledged: what the relay confirmed
// reaches the consumer within moments, and then every row left in the
// outbox must be one not delivered. after names the stop, for the messages.
func checkAcknowledged(ctx context.Context, t *testing.T, db *testenv.DB, v *validator.Validator, after string) {
	t.Helper()
	left := outboxRows(ctx, t, db)
	// The consumer may still be taking what the broker holds: wait while
	// deliveries arrive.
	_ = progress.Wait(ctx, "wait for the consumer", func() int64 { return int64(v.Received()) }, func() bool { return v.Missing() == left })
	if missing := v.Missing(); missing != left {
		t.Errorf("after %s %d rows are left in the outbox but %d messages were not delivered: "+
			"%d delivered messages were not acknowledged (they will be published again)", after, left, missing, left-missing)
	}
	t.Logf("after %s: %d rows left, %d messages undelivered", after, left, v.Missing())
}

func outboxRows(ctx context.Context, t *testing.T, db *testenv.DB) int {
	t.Helper()
	var n int
	if err := db.SQL.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A 12,000-message stream while the relay is SIGKILLed three times at random
// moments mid-publish and restarted with the same flags: every message
// arrives, first deliveries keep commit order per partition, the outbox ends
// empty. Duplicates (the unacknowledged tails) are allowed and logged.
func TestRunSurvivesSIGKILL(t *testing.T) {
	const total, kills = 12_000, 3
	heavy(t) // a server of its own (privateDB)
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	v := consumeAll(t, b)
	// A second queue on the exchange tells which messages were delivered,
	// to measure each kill's unacknowledged tail.
	seen := newCountingConsumer(t, b, b.DeclareQueue(t, "#"))
	// A third queue is consumed through the inbox: the kills' duplicates
	// must not become duplicate effects.
	inbox := startInboxEffects(ctx, t, db, b, b.DeclareQueue(t, "#"))
	// Each restart waits out the killed leader's lease before it publishes:
	// a short one (the test is not about its length) instead of the default
	// 10 s, 3 times. Not shorter: with a 2 s lease a busy machine has made
	// the leader miss its heartbeats and end its term, publishing again
	// what no kill left unacknowledged.
	relay := newRelayProc(t, relayArgs(t, db, b, leaderFlags()...)...)
	relay.start()
	began := time.Now()

	prodDone := crashLoad(ctx, db, v, b, total, 0)
	// Kill thresholds: distinct-delivery counts; each kill waits a further
	// 0-100 ms so it lands at an arbitrary point of publishing.
	thresholds := killThresholds(total, kills)
	lastDups, tails := 0, 0
	var lastEpoch int64
	for i, th := range thresholds {
		waitUnique(ctx, t, v, relay, th)
		// The consumer lags behind the broker: make sure the running
		// process (a leader term of its own, so a newer epoch) publishes.
		for {
			if e, n := seen.epoch(); e > lastEpoch && n >= 50 {
				break
			}
			waitUnique(ctx, t, v, relay, unique(v)+1)
		}
		time.Sleep(time.Duration(testload.RandN(100)) * time.Millisecond)
		relay.kill()
		at := unique(v)
		if at >= total {
			t.Fatalf("kill %d came after the stream was delivered (%d distinct): it proved nothing", i+1, at)
		}
		tail := seen.uncoveredTail(ctx, t, db)
		tails += tail
		dups := v.Duplicates()
		epoch, n := seen.epoch()
		lastEpoch = epoch
		t.Logf("SIGKILL %d at %d distinct deliveries (threshold %d), epoch %d had published %d: %d rows in the outbox, "+
			"%d delivered messages after the stored position; duplicates since the previous kill: %d",
			i+1, at, th, epoch, n, outboxRows(ctx, t, db), tail, dups-lastDups)
		lastDups = dups
		relay.start()
	}
	finishLoad(ctx, t, prodDone, v)
	if err := v.Check(validator.AtLeastOnce); err != nil {
		t.Fatal(err)
	}
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	t.Logf("%d messages through %d SIGKILLs in %v: %d duplicates in all (%d after the last kill), unacknowledged tails %d in all",
		total, kills, time.Since(began).Round(time.Millisecond), v.Duplicates(), v.Duplicates()-lastDups, tails)
	// A message is published again only after a kill left it delivered
	// in a transaction after the stored position.
	if v.Duplicates() > tails {
		t.Errorf("%d duplicates, but the kills left only %d delivered messages after the stored position", v.Duplicates(), tails)
	}
	st := inbox.check(ctx, t, total)
	t.Logf("inbox consumer: %d effects, %d duplicate deliveries skipped, %d retried", st.Processed, st.Duplicates, st.Retried)
	if code, took := relay.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM at the end: exit code %d after %v", code, took)
	}
}

// crashLoad writes the crash tests' stream of total messages over 100
// keys into db's outbox in the background (telling v) and returns its end;
// each of its 8 producers pauses pace after each transaction. A
// transaction is a 500-row one with probability 1%: for 12,000 messages
// about 4,500 one-row transactions and 90 of 500 rows.
func crashLoad(ctx context.Context, db *testenv.DB, v *validator.Validator, b *testenv.Broker, total int, pace time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- testload.Run(ctx, db.SQL, v, testload.Load{
			Producers: 8, Partitions: 100, Total: total, BigTxn: 500, BigShare: 0.01, Exchange: b.Exchange, Pace: pace,
		})
	}()
	return done
}

// finishLoad waits for the load (crashLoad) to end and for v to have seen
// every message it wrote.
func finishLoad(ctx context.Context, t *testing.T, prodDone <-chan error, v *validator.Validator) {
	t.Helper()
	select {
	case err := <-prodDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatalf("producers did not finish: %v", ctx.Err())
	}
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
}

// killThresholds draws kills points at random from 5%..90% of total,
// sorted.
func killThresholds(total, kills int) []int {
	thresholds := make([]int, kills)
	for i := range thresholds {
		thresholds[i] = total*5/100 + testload.RandN(total*85/100)
	}
	sortInts(thresholds)
	return thresholds
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// SIGTERM while publishing a stream: exit 0 within the shutdown timeout,
// and everything that was published was acknowledged: after the exit the
// rows left in the outbox are exactly the messages not delivered, and a
// restarted relay delivers those without a single duplicate.
//
// The producers write until the relay has exited and a batch more after
// that: so rows wait in the outbox at the SIGTERM however far behind a busy
// machine left the relay (with a fixed stream, one that had all been read
// before the SIGTERM could all arrive while the relay finished what it had
// in flight, and the test proved nothing).
//
// --shutdown-timeout is two minutes: on a busy machine the broker's confirms
// of what is in flight take longer than the default (a run at load 25 left
// 1,810 messages unconfirmed after 20 s, which the relay then rightly
// publishes again); a relay that waits for nothing still exits at once, one
// that waits for ever fails.
func TestRunSIGTERMIsClean(t *testing.T) {
	const shutdownTimeout = 2 * time.Minute
	heavy(t) // a server of its own (privateDB)
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	v := consumeAll(t, b)
	relay := newRelayProc(t, relayArgs(t, db, b, "--shutdown-timeout", shutdownTimeout.String())...)
	relay.start()
	relay.waitLog(ctx, "tailing the binlog")

	var stopProd atomic.Bool
	var batches atomic.Int64
	prodDone := make(chan error, 1)
	go func() {
		for !stopProd.Load() {
			// Paced (at most 800 transactions a second), in batches of
			// 800 messages, 1% of the transactions of 500 rows.
			if err := testload.Run(ctx, db.SQL, v, testload.Load{
				Producers: 8, Partitions: 100, Total: 800, BigTxn: 500, BigShare: 0.01, Exchange: b.Exchange,
				Pace: 10 * time.Millisecond,
			}); err != nil {
				prodDone <- err
				return
			}
			batches.Add(1)
		}
		prodDone <- nil
	}()
	th := 1_600 + testload.RandN(3_200)
	waitUnique(ctx, t, v, relay, th)
	code, took := relay.terminate(shutdownTimeout + 10*time.Second)
	at := unique(v)
	t.Logf("SIGTERM at %d distinct deliveries (threshold %d): exit code %d after %v", at, th, code, took.Round(time.Millisecond))
	if code != 0 {
		t.Fatalf("SIGTERM: exit code %d, want 0", code)
	}
	if took > shutdownTimeout {
		t.Errorf("shutdown took %v, more than --shutdown-timeout %v", took, shutdownTimeout)
	}
	// A whole batch written after the exit: rows the relay never read.
	after := batches.Load() + 1
	if err := progress.Wait(ctx, "a batch written after the exit", func() int64 { return int64(v.ExpectedCount()) },
		func() bool { return batches.Load() > after }); err != nil {
		t.Fatal(err)
	}
	stopProd.Store(true)
	if err := <-prodDone; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages written in all", v.ExpectedCount())

	checkAcknowledged(ctx, t, db, v, "a clean shutdown")

	relay.start()
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	if code, took := relay.terminate(time.Minute); code != 0 {
		t.Fatalf("second SIGTERM: exit code %d after %v", code, took)
	}
}

// SIGTERM while the AMQP broker is unreachable (a port nothing listens on)
// and rows wait in the outbox: nothing can be confirmed, so the relay does
// not wait out --shutdown-timeout (5m here, the test's bound is far below);
// it exits 0 with every row still in the outbox, and a relay started with
// the broker delivers each exactly once, in order.
func TestRunSIGTERMWithBrokerUnreachable(t *testing.T) {
	const total = 200
	ctx := testenv.WorkContext(t)
	db := testenv.MySQL(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	v := consumeAll(t, b)
	if err := testload.Run(ctx, db.SQL, v, testload.Load{Producers: 2, Partitions: 10, Total: total, Exchange: b.Exchange}); err != nil {
		t.Fatal(err)
	}
	cut := newRelayProc(t, relayArgs(t, db, b, "--mode", "poll", "--shutdown-timeout", "5m",
		"--amqp-url", "amqp://guest:guest@127.0.0.1:1/")...)
	cut.start()
	cut.waitLog(ctx, "cannot connect to the AMQP broker")
	cut.waitLog(ctx, "polling the outbox table")
	if code, _ := cut.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM with the broker unreachable: exit code %d, want 0", code)
	}
	if n := outboxRows(ctx, t, db); n != total {
		t.Fatalf("%d rows in the outbox after the stop, want all %d", n, total)
	}

	relay := newRelayProc(t, relayArgs(t, db, b, "--mode", "poll")...)
	relay.start()
	if err := v.WaitComplete(ctx); err != nil {
		t.Fatal(err)
	}
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	if err := v.Check(validator.ExactlyOnce); err != nil {
		t.Fatal(err)
	}
	if code, took := relay.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM: exit code %d after %v", code, took)
	}
}

// One committed transaction of 12,500 rows of 8 KiB (100 MB) passes through a relay
// with --max-inflight-bytes=16MiB in bounded memory: all rows arrive once, in
// order per partition, the outbox ends empty, peak RSS stays under 120 MiB,
// less than the transaction with the relay's own 50-60 MiB beside it (a
// relay holding the transaction would need both).
// Its acknowledgement keeps the leadership (default heartbeat, 2 s): the
// epoch in the progress row is the same at the end as at the start, and the
// relay never logged a loss of leadership (which ends the term, and the next
// term publishes the whole transaction again). The lease is 30 s, not the
// default 10 s: a heartbeat held behind the acknowledgement still misses it,
// while a machine so busy that one heartbeat statement takes 10 s (seen with
// a load average of 27 on two cores) does not fail the test.
func TestRunBigTransactionBoundedMemory(t *testing.T) {
	const rows, chunk, parts = 12_500, 500, 4
	const maxRSS = 120 << 20
	heavy(t) // a server of its own
	ctx := testenv.WorkContext(t)
	// A private server with room for a 100 MB transaction: the shared
	// server's 16 MB redo log makes it crawl.
	srv := testenv.StartServer(t, testenv.ServerOptions{ExtraArgs: []string{
		"--innodb-buffer-pool-size=512M", "--innodb-log-file-size=512M",
	}})
	db := srv.CreateDatabase(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	c := newCountingConsumer(t, b, b.Queue)
	relay := newRelayProc(t, relayArgs(t, db, b, "--max-inflight-bytes=16MiB", "--leader-lease=30s")...)
	relay.start()
	relay.waitLog(ctx, "tailing the binlog") // the rows come from the binlog, not the first-start sweep
	epochAtStart := progressEpoch(ctx, t, db)

	began := time.Now()
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	payload := bytes.Repeat([]byte("0123456789abcdef"), 512) // 8 KiB
	msgs := make([]outbox.Message, chunk)
	for done := 0; done < rows; done += chunk {
		for i := range msgs {
			pk := fmt.Sprintf("big-%d", (done+i)%parts)
			msgs[i] = outbox.Message{PartitionKey: pk, Exchange: b.Exchange, RoutingKey: "big." + pk, Payload: payload}
		}
		if _, err := outbox.Enqueue(ctx, tx, msgs...); err != nil {
			t.Fatalf("enqueue rows %d..: %v", done, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	t.Logf("committed one transaction of %d rows of 8 KiB in %v", rows, time.Since(began).Round(time.Millisecond))

	c.waitUnique(ctx, t, rows)
	testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox", 0)
	elapsed := time.Since(began)
	rss := relay.peakRSS()
	uniq, deliveries, disorder := c.stats()
	t.Logf("%d rows delivered (%d deliveries) and acknowledged %v after the commit; relay peak RSS (VmHWM) %.1f MiB",
		uniq, deliveries, elapsed.Round(time.Millisecond), float64(rss)/(1<<20))
	if disorder != "" {
		t.Error(disorder)
	}
	if deliveries != rows {
		t.Errorf("%d deliveries of %d messages, want each once (no fault was injected)", deliveries, rows)
	}
	if epoch := progressEpoch(ctx, t, db); epoch != epochAtStart {
		t.Errorf("epoch in outbox_relay_progress went from %d to %d: the relay lost leadership on the way", epochAtStart, epoch)
	}
	if out := relay.output(); strings.Contains(out, "leadership") {
		t.Errorf("the relay logged a loss of leadership:\n%s", grepLines(out, "leadership"))
	}
	if rss > maxRSS {
		t.Errorf("relay peak RSS %.1f MiB, want under %d MiB with --max-inflight-bytes=16MiB", float64(rss)/(1<<20), maxRSS>>20)
	}
	if code, took := relay.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM: exit code %d after %v", code, took)
	}
}

// progressEpoch is the leader epoch in the default relay's progress row.
func progressEpoch(ctx context.Context, t *testing.T, db *testenv.DB) int64 {
	t.Helper()
	var epoch int64
	if err := db.SQL.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = 'default'").Scan(&epoch); err != nil {
		t.Fatalf("read the leader epoch: %v", err)
	}
	return epoch
}

// grepLines returns the lines of out that contain s.
func grepLines(out, s string) string {
	var b strings.Builder
	for line := range strings.Lines(out) {
		if strings.Contains(line, s) {
			b.WriteString(line)
		}
	}
	return b.String()
}

// countingConsumer counts distinct message ids and checks that first
// deliveries come in x-outbox-id order per partition (one transaction: id
// order is commit order). It keeps no bodies.
type countingConsumer struct {
	mu         sync.Mutex
	seen       map[string]bool
	deliveries int
	lastID     map[string]int64
	disorder   string
	maxEpoch   int64 // the newest x-relay-epoch seen: the current leader term
	atMax      int   // deliveries with it
}

func newCountingConsumer(t *testing.T, b *testenv.Broker, queue string) *countingConsumer {
	t.Helper()
	c := &countingConsumer{seen: map[string]bool{}, lastID: map[string]int64{}}
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(2000, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range deliveries {
			c.observe(d)
		}
	}()
	return c
}

func (c *countingConsumer) observe(d amqp.Delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deliveries++
	if epoch, _ := d.Headers["x-relay-epoch"].(int64); epoch > c.maxEpoch {
		c.maxEpoch, c.atMax = epoch, 1
	} else if epoch == c.maxEpoch {
		c.atMax++
	}
	if c.seen[d.MessageId] {
		return
	}
	c.seen[d.MessageId] = true
	pk, _ := d.Headers["x-partition-key"].(string)
	id, _ := d.Headers["x-outbox-id"].(int64)
	if last := c.lastID[pk]; id <= last && c.disorder == "" {
		c.disorder = fmt.Sprintf("partition %q: first delivery of outbox id %d after id %d", pk, id, last)
	}
	c.lastID[pk] = id
}

func (c *countingConsumer) stats() (unique, deliveries int, disorder string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen), c.deliveries, c.disorder
}

// epoch is the newest leader term seen and how many deliveries it made.
func (c *countingConsumer) epoch() (epoch int64, deliveries int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxEpoch, c.atMax
}

// waitUnique waits until n distinct messages have arrived; it fails when
// no delivery has come for progress.Patience.
func (c *countingConsumer) waitUnique(ctx context.Context, t *testing.T, n int) {
	t.Helper()
	var u, d int
	err := progress.Wait(ctx, "wait for distinct deliveries", func() int64 {
		u, d, _ = c.stats()
		return int64(d)
	}, func() bool { return u >= n })
	if err != nil {
		t.Fatalf("%d of %d messages arrived (%d deliveries): %v", u, n, d, err)
	}
}

// Each preflight failure: exit code 2 and a last stderr line that names
// the problem and the fix. The relays run with --mode binlog: under the
// default --mode auto a server that cannot serve the binlog is not an error,
// the relay polls instead (docs/operations.md, "Modes").
func TestRunPreflightFailures(t *testing.T) {
	t.Parallel() // servers of its own; mostly waits for leases and exits
	ctx := testenv.WorkContext(t)
	b := testenv.RabbitMQ(t)
	binlogRelay := func(t *testing.T, db *testenv.DB, extra ...string) *relayProc {
		return newRelayProc(t, relayArgs(t, db, b, append([]string{"--mode", "binlog"}, extra...)...)...)
	}

	expect := func(t *testing.T, p *relayProc, wantCode int, want ...string) {
		t.Helper()
		code := p.runToExit(time.Minute)
		line := p.lastLine()
		t.Logf("exit code %d: %s", code, line)
		if code != wantCode {
			t.Errorf("exit code %d, want %d; last line %q", code, wantCode, line)
		}
		if !strings.HasPrefix(line, "outbox-relay: ") {
			t.Errorf("last line %q is not the error line", line)
		}
		for _, w := range want { // "a|b": either
			found := false
			for alt := range strings.SplitSeq(w, "|") {
				found = found || strings.Contains(line, alt)
			}
			if !found {
				t.Errorf("error line %q does not contain %q", line, w)
			}
		}
	}

	t.Run("log_bin", func(t *testing.T) {
		srv := testenv.StartServer(t, testenv.ServerOptions{NoBinlog: true})
		db := srv.CreateDatabase(t)
		expect(t, binlogRelay(t, db), 2, "log_bin is OFF", "log-bin=")
	})

	srv := testenv.StartServer(t, testenv.ServerOptions{})
	db := srv.CreateDatabase(t)
	migrate(t, db.DSN)
	root := srv.Root(t)
	setGlobal := func(t *testing.T, name, value, restore string) {
		t.Helper()
		if _, err := root.ExecContext(ctx, fmt.Sprintf("SET GLOBAL %s = '%s'", name, value)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := root.Exec(fmt.Sprintf("SET GLOBAL %s = '%s'", name, restore)); err != nil {
				t.Errorf("restore %s: %v", name, err)
			}
		})
	}
	for _, c := range []struct{ name, bad, good string }{
		{"binlog_format", "STATEMENT", "ROW"},
		{"binlog_row_image", "MINIMAL", "FULL"},
		{"binlog_row_metadata", "MINIMAL", "FULL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			setGlobal(t, c.name, c.bad, c.good)
			expect(t, binlogRelay(t, db), 2,
				c.name+" is "+c.bad, c.name+"="+c.good, "SET GLOBAL "+c.name+"='"+c.good+"'")
		})
	}

	// Users with everything on the database and only one of the two
	// replication privileges.
	userDSN := func(t *testing.T, user, grant string) string {
		t.Helper()
		for _, q := range []string{
			fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY 'pw-%s'", user, user),
			fmt.Sprintf("GRANT ALL ON `%s`.* TO '%s'@'%%'", db.Name, user),
			fmt.Sprintf("GRANT %s ON *.* TO '%s'@'%%'", grant, user),
		} {
			if _, err := root.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		t.Cleanup(func() { _, _ = root.Exec(fmt.Sprintf("DROP USER '%s'@'%%'", user)) })
		return fmt.Sprintf("%s:pw-%s@tcp(%s)/%s", user, user, srv.Addr(), db.Name)
	}
	t.Run("REPLICATION_SLAVE", func(t *testing.T) {
		dsn := userDSN(t, "noslave", "REPLICATION CLIENT")
		expect(t, binlogRelay(t, db, "--mysql-dsn", dsn), 2,
			"lacks REPLICATION SLAVE", "GRANT REPLICATION SLAVE ON *.* TO 'noslave'@'%'")
	})
	t.Run("REPLICATION_CLIENT", func(t *testing.T) {
		dsn := userDSN(t, "noclient", "REPLICATION SLAVE")
		// MariaDB 10.5+ calls REPLICATION CLIENT "BINLOG MONITOR" (the old
		// name is an alias): either names the missing privilege and the fix.
		expect(t, binlogRelay(t, db, "--mysql-dsn", dsn), 2,
			"lacks REPLICATION CLIENT|lacks BINLOG MONITOR",
			"GRANT BINLOG MONITOR ON *.* TO 'noclient'@'%'|GRANT REPLICATION CLIENT ON *.* TO 'noclient'@'%'")
	})
	t.Run("server_id", func(t *testing.T) {
		id := strconv.FormatUint(uint64(srv.ServerID()), 10)
		expect(t, binlogRelay(t, db, "--server-id", id), 2,
			"server id "+id+" is the server's own @@server_id", "choose another --server-id")
	})

	// A checkpoint whose binlogs were purged while the relay was stopped:
	// in --mode binlog a setup error like the others (docs/operations.md, "Server requirements"), exit
	// code 2, the line naming the purge and the fix. (--mode auto falls
	// back to polling instead, docs/operations.md, "Modes".)
	t.Run("purged_checkpoint", func(t *testing.T) {
		p := binlogRelay(t, db)
		p.start()
		p.waitLog(ctx, "tailing the binlog")
		// The leadership heartbeats are transactions the relay reads past;
		// with --checkpoint-interval 1s it soon stores a position.
		testload.WaitRows(ctx, t, db.SQL, "SELECT COUNT(*) FROM outbox_relay_progress WHERE COALESCE(gtid_set, '') <> ''", 1)
		if code, took := p.terminate(time.Minute); code != 0 {
			t.Fatalf("SIGTERM: exit code %d after %v", code, took)
		}
		v := validator.New()
		testload.Produce(ctx, t, db.SQL, v, testload.Load{Producers: 1, Partitions: 1, Total: 10, Exchange: b.Exchange})
		srv.PurgeBinlogs(t)
		expect(t, p, 2, "is no longer available on the server", "binlog_expire_logs_seconds")
	})
}
