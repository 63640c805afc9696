package bench

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// Config says what to measure and where.
type Config struct {
	MySQLDSN      string // a binlog-enabled server; its database is emptied
	AMQPURL       string
	RelayBinary   string   // the outbox-relay executable to run
	Modes         []string // relay modes to measure side by side: "binlog", "poll"
	Rate          float64  // messages per second in the latency phase; default 500
	Duration      time.Duration
	Backlog       int
	PayloadBytes  int
	Runs          int
	ConfirmWindow int       // the relay's per-lane window, and the bare publisher's
	Progress      io.Writer // a progress line for long phases; nil for none
}

// Validate fills defaults and checks values.
func (c *Config) Validate() error {
	if c.MySQLDSN == "" || c.AMQPURL == "" || c.RelayBinary == "" {
		return errors.New("bench needs a MySQL DSN, an AMQP URL and the relay binary")
	}
	if c.Rate <= 0 {
		c.Rate = 500
	}
	if c.Duration <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.Backlog <= 0 {
		c.Backlog = 200_000
	}
	if c.PayloadBytes <= 0 {
		c.PayloadBytes = 256
	}
	if c.Runs <= 0 {
		c.Runs = 3
	}
	if c.ConfirmWindow <= 0 {
		c.ConfirmWindow = 256
	}
	if len(c.Modes) == 0 {
		c.Modes = []string{"binlog", "poll"}
	}
	return nil
}

// ModeResult is what one relay mode measured.
type ModeResult struct {
	LatencyP50Ms    Stat `json:"latency_p50_ms"`
	LatencyP95Ms    Stat `json:"latency_p95_ms"`
	LatencyP99Ms    Stat `json:"latency_p99_ms"`
	LatencyMaxMs    Stat `json:"latency_max_ms"`
	CatchUpMsgsPerS Stat `json:"catch_up_msgs_per_s"`
	RatioToBare     Stat `json:"ratio_to_bare"`
	IdleQueriesPerS Stat `json:"idle_queries_per_s"`
	RelayCPUSeconds Stat `json:"relay_cpu_seconds"`
	RelayPeakRSSMiB Stat `json:"relay_peak_rss_mib"`
}

// Result is a whole bench.
type Result struct {
	Machine      string                `json:"machine"`
	Runs         int                   `json:"runs"`
	Rate         float64               `json:"rate"`
	DurationS    float64               `json:"duration_s"`
	Backlog      int                   `json:"backlog"`
	PayloadBytes int                   `json:"payload_bytes"`
	Window       int                   `json:"confirm_window"`
	BareMsgsPerS Stat                  `json:"bare_publisher_msgs_per_s"`
	Modes        map[string]ModeResult `json:"modes"`
}

const (
	exchangeName = "outbox-bench"
	queueName    = "outbox-bench"
	relayName    = "bench"
)

type bencher struct {
	cfg      Config
	db       *sql.DB
	cons     *consumer
	logs     *bytes.Buffer
	lastDraw time.Time
}

// Run measures every mode cfg.Runs times.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dsn, err := mysql.ParseDSN(cfg.MySQLDSN)
	if err != nil {
		return nil, fmt.Errorf("bench: --mysql-dsn: %w", err)
	}
	dsn.ParseTime, dsn.Loc = true, time.UTC
	connector, err := mysql.NewConnector(dsn)
	if err != nil {
		return nil, fmt.Errorf("bench: --mysql-dsn: %w", err)
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	if _, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil {
		return nil, fmt.Errorf("bench: migrate: %w", err)
	}
	cons, err := newConsumer(cfg.AMQPURL)
	if err != nil {
		return nil, err
	}
	defer cons.close()
	b := &bencher{cfg: cfg, db: db, cons: cons, logs: &bytes.Buffer{}}

	res := &Result{
		Machine: machine(ctx, db), Runs: cfg.Runs, Rate: cfg.Rate, DurationS: cfg.Duration.Seconds(),
		Backlog: cfg.Backlog, PayloadBytes: cfg.PayloadBytes, Window: cfg.ConfirmWindow, Modes: map[string]ModeResult{},
	}
	samples := map[string]map[string][]float64{}
	var bare []float64
	for run := 1; run <= cfg.Runs; run++ {
		for _, mode := range cfg.Modes {
			s, err := b.runOnce(ctx, mode, run)
			if err != nil {
				return nil, fmt.Errorf("bench: %s run %d: %w", mode, run, err)
			}
			if samples[mode] == nil {
				samples[mode] = map[string][]float64{}
			}
			for k, v := range s {
				samples[mode][k] = append(samples[mode][k], v)
			}
		}
		rate, err := b.bare(ctx, run)
		if err != nil {
			return nil, fmt.Errorf("bench: bare publisher run %d: %w", run, err)
		}
		bare = append(bare, rate)
		for _, mode := range cfg.Modes {
			n := len(samples[mode]["catch_up"])
			samples[mode]["ratio"] = append(samples[mode]["ratio"], samples[mode]["catch_up"][n-1]/rate)
		}
	}
	b.progress("")
	res.BareMsgsPerS = statOf(bare)
	for mode, s := range samples {
		res.Modes[mode] = ModeResult{
			LatencyP50Ms: statOf(s["p50"]), LatencyP95Ms: statOf(s["p95"]), LatencyP99Ms: statOf(s["p99"]),
			LatencyMaxMs: statOf(s["max"]), CatchUpMsgsPerS: statOf(s["catch_up"]), RatioToBare: statOf(s["ratio"]),
			IdleQueriesPerS: statOf(s["idle_qps"]), RelayCPUSeconds: statOf(s["cpu"]), RelayPeakRSSMiB: statOf(s["rss"]),
		}
	}
	return res, nil
}

func (b *bencher) progress(format string, a ...any) {
	if b.cfg.Progress == nil {
		return
	}
	line := fmt.Sprintf(format, a...)
	fmt.Fprintf(b.cfg.Progress, "\r\033[K%s", line)
}

func (b *bencher) bar(phase string, done, total int) {
	if done < total && time.Since(b.lastDraw) < 250*time.Millisecond {
		return // a few redraws a second are enough for a person
	}
	b.lastDraw = time.Now()
	const width = 30
	n := 0
	if total > 0 {
		n = min(width, done*width/total)
	}
	b.progress("%-28s [%s%s] %d/%d", phase, strings.Repeat("#", n), strings.Repeat(".", width-n), done, total)
}

// reset empties the outbox and the bench relay's progress, and the queue.
func (b *bencher) reset(ctx context.Context) error {
	for _, q := range []string{"DELETE FROM outbox", "DELETE FROM outbox_relay_progress WHERE relay_name = '" + relayName + "'", "DELETE FROM outbox_failed"} {
		if _, err := b.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("reset: %s: %w", q, err)
		}
	}
	return b.cons.purge()
}

// runOnce measures one mode once: latency, idle queries, catch-up.
func (b *bencher) runOnce(ctx context.Context, mode string, run int) (map[string]float64, error) {
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	relay, err := b.startRelay(ctx, mode)
	if err != nil {
		return nil, err
	}
	defer relay.kill()
	if err := b.probe(ctx); err != nil {
		return nil, fmt.Errorf("relay not delivering (log follows):\n%s: %w", b.logs.String(), err)
	}

	lat, err := b.latency(ctx, fmt.Sprintf("%s run %d: latency", mode, run))
	if err != nil {
		return nil, err
	}
	slices.Sort(lat)
	out["p50"], out["p95"], out["p99"] = percentileMs(lat, 0.50), percentileMs(lat, 0.95), percentileMs(lat, 0.99)
	out["max"] = percentileMs(lat, 1)

	b.progress("%s run %d: idle", mode, run)
	if out["idle_qps"], err = b.idleQueries(ctx, 5*time.Second); err != nil {
		return nil, err
	}
	cpu1, rss1, err := procUsage(relay.cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	if err := relay.stop(); err != nil {
		return nil, err
	}

	if err := b.writeBacklog(ctx, fmt.Sprintf("%s run %d: writing backlog", mode, run)); err != nil {
		return nil, err
	}
	b.cons.expect(b.cfg.Backlog)
	start := time.Now()
	relay, err = b.startRelay(ctx, mode)
	if err != nil {
		return nil, err
	}
	defer relay.kill()
	if err := b.cons.wait(ctx, 10*time.Minute, func(n int) { b.bar(fmt.Sprintf("%s run %d: catch-up", mode, run), n, b.cfg.Backlog) }); err != nil {
		return nil, fmt.Errorf("catch-up: %w", err)
	}
	out["catch_up"] = float64(b.cfg.Backlog) / time.Since(start).Seconds()
	cpu2, rss2, err := procUsage(relay.cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	if err := relay.stop(); err != nil {
		return nil, err
	}
	out["cpu"], out["rss"] = cpu1+cpu2, max(rss1, rss2)
	return out, nil
}

// probe writes one message and waits for it: the relay is then tailing.
func (b *bencher) probe(ctx context.Context) error {
	b.cons.expect(1)
	if _, err := outbox.Enqueue(ctx, b.db, outbox.Message{RoutingKey: "probe", Payload: []byte("{}")}); err != nil {
		return fmt.Errorf("write probe: %w", err)
	}
	return b.cons.wait(ctx, time.Minute, nil)
}

// latency writes one-row transactions at cfg.Rate for cfg.Duration and
// returns each message's commit → receive time. Commit start is recorded
// before the commit: the relay may deliver before Commit returns.
func (b *bencher) latency(ctx context.Context, phase string) ([]time.Duration, error) {
	total := int(b.cfg.Rate * b.cfg.Duration.Seconds())
	b.cons.expect(total)
	payload := bytes.Repeat([]byte("x"), b.cfg.PayloadBytes)
	interval := time.Duration(float64(time.Second) / b.cfg.Rate)
	start := time.Now()
	for i := 0; i < total; i++ {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d) // pacing the producer is the point here
		}
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, fmt.Errorf("latency: begin: %w", err)
		}
		ids, err := outbox.Enqueue(ctx, tx, outbox.Message{PartitionKey: fmt.Sprintf("p%d", i%64), RoutingKey: "latency", Payload: payload})
		if err != nil {
			tx.Rollback()
			return nil, fmt.Errorf("latency: enqueue: %w", err)
		}
		b.cons.sent(ids[0].String(), time.Now())
		if err := tx.Commit(); err != nil {
			return nil, fmt.Errorf("latency: commit: %w", err)
		}
		if i%100 == 0 {
			b.bar(phase, i, total)
		}
	}
	if err := b.cons.wait(ctx, time.Minute, nil); err != nil {
		return nil, fmt.Errorf("latency: %w", err)
	}
	return b.cons.latencies(), nil
}

// idleQueries is the server's statements per second over d while nothing
// is written, less the two of this measurement.
func (b *bencher) idleQueries(ctx context.Context, d time.Duration) (float64, error) {
	read := func() (float64, error) {
		var name string
		var v float64
		err := b.db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &v)
		return v, err
	}
	before, err := read()
	if err != nil {
		return 0, fmt.Errorf("idle: read Questions: %w", err)
	}
	select {
	case <-time.After(d): // the idle period is what is measured
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	after, err := read()
	if err != nil {
		return 0, fmt.Errorf("idle: read Questions: %w", err)
	}
	return max(after-before-1, 0) / d.Seconds(), nil
}

// writeBacklog writes cfg.Backlog rows in 1,000-row transactions over 1,000
// partitions while no relay runs.
func (b *bencher) writeBacklog(ctx context.Context, phase string) error {
	payload := bytes.Repeat([]byte("x"), b.cfg.PayloadBytes)
	const perTxn = 1000
	msgs := make([]outbox.Message, 0, perTxn)
	for done := 0; done < b.cfg.Backlog; {
		n := min(perTxn, b.cfg.Backlog-done)
		msgs = msgs[:0]
		for i := 0; i < n; i++ {
			msgs = append(msgs, outbox.Message{PartitionKey: fmt.Sprintf("p%d", (done+i)%1000), RoutingKey: "backlog", Payload: payload})
		}
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("backlog: begin: %w", err)
		}
		if _, err := outbox.Enqueue(ctx, tx, msgs...); err != nil {
			tx.Rollback()
			return fmt.Errorf("backlog: enqueue: %w", err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("backlog: commit: %w", err)
		}
		done += n
		b.bar(phase, done, b.cfg.Backlog)
	}
	return nil
}

type relayProc struct {
	cmd  *exec.Cmd
	done chan error
}

func (b *bencher) startRelay(ctx context.Context, mode string) (*relayProc, error) {
	args := []string{"run", "--mysql-dsn", b.cfg.MySQLDSN, "--amqp-url", b.cfg.AMQPURL,
		"--relay-name", relayName, "--default-exchange", exchangeName, "--log-format", "console", "--metrics-addr", "127.0.0.1:0",
		"--confirm-window", fmt.Sprint(b.cfg.ConfirmWindow), "--mode", mode}
	cmd := exec.CommandContext(ctx, b.cfg.RelayBinary, args...)
	b.logs.Reset()
	cmd.Stdout, cmd.Stderr = b.logs, b.logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start relay %s: %w", b.cfg.RelayBinary, err)
	}
	p := &relayProc{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// stop sends SIGTERM and waits for a clean exit.
func (p *relayProc) stop() error {
	if p.cmd.ProcessState != nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			return fmt.Errorf("relay exited with %v", err)
		}
		return nil
	case <-time.After(time.Minute):
		p.kill()
		return errors.New("relay did not stop within a minute of SIGTERM")
	}
}

func (p *relayProc) kill() {
	select {
	case err := <-p.done:
		p.done <- err
	default:
		_ = p.cmd.Process.Kill()
		p.done <- <-p.done
	}
}

// bare publishes cfg.Backlog messages like the relay's for the backlog
// (persistent, mandatory, same size, properties and headers) from one
// channel with the same confirm window, and returns msgs/s until the
// consumer received them all.
func (b *bencher) bare(ctx context.Context, run int) (float64, error) {
	if err := b.cons.purge(); err != nil {
		return 0, err
	}
	conn, err := amqp.Dial(b.cfg.AMQPURL)
	if err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	payload := bytes.Repeat([]byte("x"), b.cfg.PayloadBytes)
	b.cons.expect(b.cfg.Backlog)
	start := time.Now()
	// One channel with at most ConfirmWindow unconfirmed, like each relay
	// lane, sending the message the relay sends for a backlog row (design
	// §3): properties and the relay's headers. Broker cost grows with them,
	// so a lighter message would not be the same ceiling.
	err = PublishBare(ctx, conn, exchangeName, "backlog", 1, b.cfg.Backlog, b.cfg.ConfirmWindow, func(i int) amqp.Publishing {
		return amqp.Publishing{
			MessageId: fmt.Sprintf("bare-%d", i), DeliveryMode: amqp.Persistent, ContentType: "application/json",
			Type: "", Timestamp: time.Now(), Body: payload,
			Headers: amqp.Table{"x-outbox-id": int64(i + 1), "x-partition-key": fmt.Sprintf("p%d", i%1000), "x-relay-epoch": int64(1)},
		}
	})
	if err != nil {
		return 0, err
	}
	if err := b.cons.wait(ctx, 10*time.Minute, func(n int) { b.bar(fmt.Sprintf("run %d: bare publisher", run), n, b.cfg.Backlog) }); err != nil {
		return 0, fmt.Errorf("bare publisher: %w", err)
	}
	return float64(b.cfg.Backlog) / time.Since(start).Seconds(), nil
}

func machine(ctx context.Context, db *sql.DB) string {
	var version string
	_ = db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version)
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%s, %d cores, %s, MySQL %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), host, version)
}
