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
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/internal/mysqlconn"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// Config says what to measure and where.
type Config struct {
	MySQLDSN      string            // a binlog-enabled server; its database is emptied
	MySQL         mysqlconn.Options // TLS files and password file of MySQLDSN (its DSN field is ignored), passed on to the relay
	AMQPURL       string
	AMQPOptions   publish.ConnOptions // TLS files and password file, for every connection bench and its relay open
	RelayBinary   string              // the outbox-relay executable to run
	Modes         []string            // relay modes to measure side by side: "binlog", "poll"
	Rate          float64             // messages per second in the latency phase; default 500
	Duration      time.Duration
	Backlog       int
	PayloadBytes  int
	Runs          int
	ConfirmWindow int // the relay's per-lane window, and the bare publisher's
	// QueueType is the bench queue's type: "classic" (the default) or
	// "quorum" (on a cluster: AMQPURL may list its nodes; the bare
	// publisher and the consumer use the first, the relay all of them).
	QueueType string
	// Shapes are the catch-up backlog shapes measured after the other
	// phases (names in DefaultShapes), each beside the bare publisher at
	// window 1000 and at window = keys; ShapeBacklog is their size.
	Shapes       []string
	ShapeBacklog int
	ShapesOnly   bool // measure the shapes alone: no latency, idle or --backlog catch-up
	// BaselineBinary, when set, is another build of outbox-relay whose
	// catch-up of each shape is measured right after RelayBinary's, in the
	// same run (its mode is named "<mode> baseline").
	BaselineBinary string
	// StreamPartitions, when above 0, measures the stream destination
	// instead of the AMQP exchange (runStreams): that many partition
	// streams per phase, declared by bench on the first AMQP URL's broker
	// at the stream port (as the relay derives its --stream-url) and
	// deleted when the phase ends, beside the bare stream producer.
	StreamPartitions int
	// RelayFlags are more flags for every relay run (each after the
	// flags bench sets, so they may override them).
	RelayFlags []string
	Progress   io.Writer // a progress line for long phases; nil for none
}

// firstURL is the first URL of AMQPURL: the node bench's own connections use.
func (c *Config) firstURL() string {
	urls, err := publish.SplitURLs(c.AMQPURL)
	if err != nil || len(urls) == 0 {
		return c.AMQPURL
	}
	return urls[0]
}

// Validate fills defaults and checks values.
func (c *Config) Validate() error {
	if c.MySQLDSN == "" || c.AMQPURL == "" || c.RelayBinary == "" {
		return errors.New("bench needs a MySQL DSN, an AMQP URL and the relay binary")
	}
	if err := c.AMQPOptions.Check(c.AMQPURL); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	switch c.QueueType {
	case "":
		c.QueueType = "classic"
	case "classic", "quorum":
	default:
		return fmt.Errorf("bench: queue type %q: want classic or quorum", c.QueueType)
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
	if c.ShapeBacklog <= 0 {
		c.ShapeBacklog = 50_000
	}
	for _, name := range c.Shapes {
		if _, err := shapeNamed(name, c.ShapeBacklog); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	if c.StreamPartitions < 0 || c.StreamPartitions > streams.MaxPartitions {
		return fmt.Errorf("bench: stream partitions %d: between 0 (the AMQP destination) and %d", c.StreamPartitions, streams.MaxPartitions)
	}
	if c.StreamPartitions > 0 {
		if len(c.Shapes) > 0 || c.ShapesOnly || c.BaselineBinary != "" {
			return errors.New("bench: the catch-up shapes and the baseline binary are measured into the AMQP destination only, not with stream partitions")
		}
		if c.ConfirmWindow > streams.MaxWindow {
			return fmt.Errorf("bench: confirm window %d: at most %d for the stream destination", c.ConfirmWindow, streams.MaxWindow)
		}
	}
	if c.ShapesOnly && len(c.Shapes) == 0 {
		return errors.New("bench: shapes only, but no shapes to measure")
	}
	return nil
}

// Latency is the latency phase's figures, alike into a queue and into the
// streams (its fields are inlined in the JSON of the result embedding it).
type Latency struct {
	LatencyP50Ms Stat `json:"latency_p50_ms"`
	LatencyP95Ms Stat `json:"latency_p95_ms"`
	LatencyP99Ms Stat `json:"latency_p99_ms"`
	LatencyMaxMs Stat `json:"latency_max_ms"`
	// A bare publisher's publish → receive latency at the same rate to the
	// same destination, measured just before the relay's.
	BareLatencyP50Ms Stat `json:"bare_latency_p50_ms"`
	BareLatencyP99Ms Stat `json:"bare_latency_p99_ms"`
	// How long the latency phase's COMMITs took: a max near the latency max
	// means the stall was the database's commit, not the relay.
	CommitP99Ms Stat `json:"commit_p99_ms"`
	CommitMaxMs Stat `json:"commit_max_ms"`
}

// latencyOf is the Latency of one mode's samples.
func latencyOf(s map[string][]float64) Latency {
	return Latency{
		LatencyP50Ms: statOf(s["p50"]), LatencyP95Ms: statOf(s["p95"]), LatencyP99Ms: statOf(s["p99"]),
		LatencyMaxMs: statOf(s["max"]), BareLatencyP50Ms: statOf(s["bare_p50"]), BareLatencyP99Ms: statOf(s["bare_p99"]),
		CommitP99Ms: statOf(s["commit_p99"]), CommitMaxMs: statOf(s["commit_max"]),
	}
}

// ModeResult is what one relay mode measured.
type ModeResult struct {
	Latency              // its bare publisher is a plain amqp091 one
	CatchUpMsgsPerS Stat `json:"catch_up_msgs_per_s"` // into the queue, no consumer attached
	RatioToBare     Stat `json:"ratio_to_bare"`
	// The same catch-up while a consumer drains the queue as fast as it
	// can, on the same machine, against the bare publisher measured so.
	CatchUpLiveMsgsPerS Stat `json:"catch_up_live_consumer_msgs_per_s"`
	RatioToBareLive     Stat `json:"ratio_to_bare_live_consumer"`
	// Deliveries that repeated a message, in each catch-up (0 expected:
	// the relay repeats only what was unconfirmed at a fault).
	CatchUpRepeats     Stat `json:"catch_up_repeats"`
	CatchUpLiveRepeats Stat `json:"catch_up_live_consumer_repeats"`
	IdleQueriesPerS    Stat `json:"idle_queries_per_s"`
	// The same while 500 scheduled messages (available_at an hour ahead)
	// wait in the outbox.
	ScheduledQueriesPerS Stat `json:"idle_scheduled_queries_per_s"`
	RelayCPUSeconds      Stat `json:"relay_cpu_seconds"`
	RelayPeakRSSMiB      Stat `json:"relay_peak_rss_mib"`
}

// Result is a whole bench.
type Result struct {
	Machine          string                `json:"machine"`
	Runs             int                   `json:"runs"`
	Rate             float64               `json:"rate"`
	DurationS        float64               `json:"duration_s"`
	Backlog          int                   `json:"backlog"`
	PayloadBytes     int                   `json:"payload_bytes"`
	Window           int                   `json:"confirm_window"`
	RelayFlags       []string              `json:"relay_flags,omitempty"`
	BareMsgsPerS     Stat                  `json:"bare_publisher_msgs_per_s"`
	BareLiveMsgsPerS Stat                  `json:"bare_publisher_live_consumer_msgs_per_s"`
	Modes            map[string]ModeResult `json:"modes"`
	Shapes           []ShapeResult         `json:"shapes,omitempty"`
	// Stream is the stream destination's bench (Config.StreamPartitions);
	// Modes and the bare publisher's figures are then empty.
	Stream *StreamResult `json:"stream,omitempty"`
}

// relayName is the bench relay's --relay-name, in the bench's own database.
const relayName = "bench"

type bencher struct {
	cfg      Config
	exchange string // per run of bench: other benches and tests may share the broker
	db       *sql.DB
	cons     *consumer
	full     *fullQueue // the queue "+full" shapes keep full; nil when none is measured
	logs     *bytes.Buffer
	lastDraw time.Time

	// The stream destination (Config.StreamPartitions): the partitions'
	// connection settings, the connection that declares and deletes each
	// phase's streams, and the number of the last phase's streams.
	streamCfg streams.Config
	streamEnv *stream.Environment
	streamSeq int
}

// Run measures every mode cfg.Runs times.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer b.close()
	db := b.db
	res := &Result{
		Machine: machine(ctx, db), Runs: cfg.Runs, Rate: cfg.Rate, DurationS: cfg.Duration.Seconds(),
		Backlog: cfg.Backlog, PayloadBytes: cfg.PayloadBytes, Window: cfg.ConfirmWindow, RelayFlags: cfg.RelayFlags, Modes: map[string]ModeResult{},
	}
	samples := map[string]map[string][]float64{}
	var bare, bareLive []float64
	shapes := make([]Shape, len(cfg.Shapes))
	shapeSamples := make([]map[string]map[string][]float64, len(cfg.Shapes))
	for i, name := range cfg.Shapes {
		shapes[i], _ = shapeNamed(name, cfg.ShapeBacklog)
		shapeSamples[i] = map[string]map[string][]float64{}
	}
	if cfg.StreamPartitions > 0 {
		if err := b.runStreams(ctx, res); err != nil {
			return nil, err
		}
		return res, nil
	}
	meter := cpuMeter{dbPID: serverPID(ctx, db), brokerPID: brokerPID(cfg.AMQPURL)}
	for run := 1; run <= cfg.Runs; run++ {
		for i, s := range shapes {
			if err := b.shapeOnce(ctx, s, run, meter, shapeSamples[i]); err != nil {
				return nil, fmt.Errorf("bench: %s run %d: %w", s.describe(), run, err)
			}
		}
		if cfg.ShapesOnly {
			continue
		}
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
		rate, err := b.bare(ctx, run, false)
		if err != nil {
			return nil, fmt.Errorf("bench: bare publisher run %d: %w", run, err)
		}
		liveRate, err := b.bare(ctx, run, true)
		if err != nil {
			return nil, fmt.Errorf("bench: bare publisher run %d, live consumer: %w", run, err)
		}
		bare, bareLive = append(bare, rate), append(bareLive, liveRate)
		for _, mode := range cfg.Modes {
			s := samples[mode]
			n := len(s["catch_up"])
			s["ratio"] = append(s["ratio"], s["catch_up"][n-1]/rate)
			s["ratio_live"] = append(s["ratio_live"], s["catch_up_live"][n-1]/liveRate)
		}
	}
	b.progress("")
	res.Shapes = shapeResults(shapes, shapeSamples)
	res.BareMsgsPerS, res.BareLiveMsgsPerS = statOf(bare), statOf(bareLive)
	for mode, s := range samples {
		res.Modes[mode] = ModeResult{
			Latency: latencyOf(s), CatchUpMsgsPerS: statOf(s["catch_up"]), RatioToBare: statOf(s["ratio"]),
			CatchUpLiveMsgsPerS: statOf(s["catch_up_live"]), RatioToBareLive: statOf(s["ratio_live"]),
			CatchUpRepeats: statOf(s["catch_up_repeats"]), CatchUpLiveRepeats: statOf(s["catch_up_live_repeats"]),
			IdleQueriesPerS: statOf(s["idle_qps"]), ScheduledQueriesPerS: statOf(s["scheduled_qps"]), RelayCPUSeconds: statOf(s["cpu"]), RelayPeakRSSMiB: statOf(s["rss"]),
		}
	}
	return res, nil
}

// openDB opens a pool on cfg's database (times parsed as UTC) and applies
// the migrations; the caller closes it.
func openDB(ctx context.Context, cfg Config) (*sql.DB, error) {
	opts := cfg.MySQL
	opts.DSN = cfg.MySQLDSN
	target, err := mysqlconn.New(opts)
	if err != nil {
		return nil, err
	}
	db, err := target.OpenDB(func(dsn *mysql.Config) { dsn.ParseTime, dsn.Loc = true, time.UTC })
	if err != nil {
		return nil, err
	}
	if _, err := migrations.Apply(ctx, db, migrations.Options{}); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return db, nil
}

// open connects bench to the database (migrated) and to the broker, with
// an exchange and a queue of its own (and the full queue when a "+full"
// shape is measured); close undoes it.
func open(ctx context.Context, cfg Config) (*bencher, error) {
	db, err := openDB(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	// Exchange and queue names unique to this bench: a shared broker may
	// serve other benches and tests at the same time.
	name := fmt.Sprintf("outbox-bench-%d-%d", os.Getpid(), time.Now().UnixNano()%1_000_000)
	if cfg.QueueType == "quorum" {
		name = "outbox-bench-quorum-" + name[len("outbox-bench-"):]
	}
	cons, err := newConsumer(ctx, cfg.firstURL(), cfg.AMQPOptions, name, name, cfg.QueueType)
	if err != nil {
		db.Close()
		return nil, err
	}
	b := &bencher{cfg: cfg, exchange: name, db: db, cons: cons, logs: &bytes.Buffer{}}
	if slices.ContainsFunc(cfg.Shapes, func(s string) bool { return strings.HasSuffix(s, fullSuffix) }) {
		b.full = &fullQueue{exchange: name + ".full", queue: name + ".full", conn: cons.conn}
	}
	if cfg.StreamPartitions > 0 {
		if b.streamCfg, err = cfg.streamBase(); err == nil {
			b.streamEnv, err = openStreamAdmin(b.streamCfg)
		}
		if err != nil {
			b.close()
			return nil, fmt.Errorf("bench: the stream destination: %w", err)
		}
	}
	return b, nil
}

// close deletes what open declared in the broker and closes the
// connections.
func (b *bencher) close() {
	if b.streamEnv != nil {
		_ = b.streamEnv.Close()
	}
	if b.full != nil {
		b.full.close()
	}
	b.cons.close()
	b.db.Close()
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

	// The bare publisher's latency just before the relay's, on the same
	// queue and consumer, tells what the broker adds at that moment (after
	// the previous phase's burst, say) from what the relay adds.
	bareLat, err := b.bareLatency(ctx, fmt.Sprintf("%s run %d: bare publisher latency", mode, run))
	if err != nil {
		return nil, err
	}
	slices.Sort(bareLat)
	out["bare_p50"], out["bare_p99"] = percentileMs(bareLat, 0.50), percentileMs(bareLat, 0.99)
	lat, commits, err := b.latency(ctx, fmt.Sprintf("%s run %d: latency", mode, run))
	if err != nil {
		return nil, err
	}
	slices.Sort(lat)
	out["p50"], out["p95"], out["p99"] = percentileMs(lat, 0.50), percentileMs(lat, 0.95), percentileMs(lat, 0.99)
	out["max"] = percentileMs(lat, 1)
	slices.Sort(commits)
	out["commit_p99"], out["commit_max"] = percentileMs(commits, 0.99), percentileMs(commits, 1)

	b.progress("%s run %d: idle", mode, run)
	if out["idle_qps"], err = b.idleQueries(ctx, 6*time.Second); err != nil {
		return nil, err
	}
	b.progress("%s run %d: idle, %d scheduled messages waiting", mode, run, scheduledRows)
	if out["scheduled_qps"], err = b.scheduledQueries(ctx, 6*time.Second); err != nil {
		return nil, err
	}
	cpu, rss, err := procUsage(relay.cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	if err := relay.stop(); err != nil {
		return nil, err
	}

	for _, live := range []bool{false, true} {
		key, phase := "catch_up", fmt.Sprintf("%s run %d: catch-up", mode, run)
		if live {
			key, phase = "catch_up_live", phase+" to a live consumer"
		}
		if err := b.writeBacklog(ctx, phase+": writing backlog"); err != nil {
			return nil, err
		}
		var relay *relayProc
		var repeats int
		out[key], repeats, err = b.toQueue(ctx, phase, live, func() error {
			relay, err = b.startRelay(ctx, mode)
			return err
		})
		if relay != nil {
			defer relay.kill()
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", phase, err)
		}
		c, r, err := procUsage(relay.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		if err := relay.stop(); err != nil {
			return nil, err
		}
		out[key+"_repeats"] = float64(repeats)
		if !live {
			cpu += c // the latency phase and one catch-up, as before
		}
		rss = max(rss, r)
	}
	out["cpu"], out["rss"] = cpu, rss
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
// returns each message's commit → receive time, and how long each COMMIT
// took. Commit start is recorded before the commit: the relay may deliver
// before Commit returns. A slow COMMIT (the server's log flush) is in the
// first figure too, and the second tells it from a stall after the commit.
func (b *bencher) latency(ctx context.Context, phase string) (lats, commits []time.Duration, err error) {
	payload := bytes.Repeat([]byte("x"), b.cfg.PayloadBytes)
	lats, err = b.paced(ctx, phase, func(i int) error {
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		ids, err := outbox.Enqueue(ctx, tx, outbox.Message{PartitionKey: fmt.Sprintf("p%d", i%64), RoutingKey: "latency", Payload: payload})
		if err != nil {
			tx.Rollback()
			return fmt.Errorf("enqueue: %w", err)
		}
		start := time.Now()
		b.cons.sent(ids[0].String(), start)
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		commits = append(commits, time.Since(start))
		return nil
	})
	return lats, commits, err
}

// bareLatency publishes at cfg.Rate for cfg.Duration from a bare amqp091
// confirm-mode channel, with the relay's message shape, to the same queue,
// and returns each message's publish → receive time: what the broker and
// the consumer alone add, at that moment, to the relay's figures.
func (b *bencher) bareLatency(ctx context.Context, phase string) ([]time.Duration, error) {
	conn, err := publish.Dial(ctx, b.cfg.firstURL(), b.cfg.AMQPOptions, "outbox-relay bench bare publisher")
	if err != nil {
		return nil, fmt.Errorf("bare latency: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("bare latency: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("bare latency: confirm mode: %w", err)
	}
	payload := bytes.Repeat([]byte("x"), b.cfg.PayloadBytes)
	return b.paced(ctx, phase, func(i int) error {
		id := fmt.Sprintf("bare-latency-%d", i)
		b.cons.sent(id, time.Now())
		_, err := ch.PublishWithDeferredConfirmWithContext(ctx, b.exchange, "latency", true, false,
			relayShaped(id, i, fmt.Sprintf("p%d", i%64), payload))
		return err
	})
}

// relayShaped is message i as the relay sends a row (docs/wire.md): its
// properties and the relay's headers. Broker cost grows with them, so the
// bare publisher sends this shape: a lighter message would not be the same
// ceiling.
func relayShaped(id string, i int, partitionKey string, payload []byte) amqp.Publishing {
	return amqp.Publishing{
		MessageId: id, DeliveryMode: amqp.Persistent, ContentType: "application/json", Timestamp: time.Now(), Body: payload,
		Headers: amqp.Table{"x-outbox-id": int64(i + 1), "x-partition-key": partitionKey, "x-relay-epoch": int64(1)},
	}
}

// paced calls send(i) cfg.Rate times a second for cfg.Duration, then waits
// until the consumer received every message, and returns the latencies
// the consumer measured from the times send recorded.
func (b *bencher) paced(ctx context.Context, phase string, send func(i int) error) ([]time.Duration, error) {
	total := int(b.cfg.Rate * b.cfg.Duration.Seconds())
	b.cons.expect(total)
	interval := time.Duration(float64(time.Second) / b.cfg.Rate)
	start := time.Now()
	for i := 0; i < total; i++ {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d) // pacing the producer is the point here
		}
		if err := send(i); err != nil {
			return nil, fmt.Errorf("%s: message %d: %w", phase, i, err)
		}
		if i%100 == 0 {
			b.bar(phase, i, total)
		}
	}
	if err := b.cons.wait(ctx, time.Minute, nil); err != nil {
		return nil, fmt.Errorf("%s: %w", phase, err)
	}
	return b.cons.latencies(), nil
}

// idleSettle is how long idleQueries waits, once the outbox is empty,
// before it counts: the relay's last acknowledgement of the phase before
// and the backlog figure it computes after activity are not idle work.
const idleSettle = 1500 * time.Millisecond

// scheduledRows is how many scheduled messages wait while scheduledQueries
// counts.
const scheduledRows = 500

// scheduledQueries is idleQueries while scheduledRows messages due in an
// hour wait in the outbox (a user's reminders); it deletes them afterwards.
func (b *bencher) scheduledQueries(ctx context.Context, d time.Duration) (float64, error) {
	msgs := make([]outbox.Message, scheduledRows)
	at := time.Now().Add(time.Hour)
	for i := range msgs {
		msgs[i] = outbox.Message{PartitionKey: fmt.Sprintf("p%d", i%64), RoutingKey: "scheduled", Payload: []byte("{}"), AvailableAt: at}
	}
	if _, err := outbox.Enqueue(ctx, b.db, msgs...); err != nil {
		return 0, fmt.Errorf("idle with scheduled messages: write them: %w", err)
	}
	qps, err := b.idleQueries(ctx, d)
	if err != nil {
		return 0, err
	}
	if _, err := b.db.ExecContext(ctx, "DELETE FROM outbox WHERE available_at IS NOT NULL"); err != nil {
		return 0, fmt.Errorf("idle with scheduled messages: delete them: %w", err)
	}
	return qps, nil
}

// idleQueries is the server's statements per second over d while nothing
// is written, less the two of this measurement. It starts once the relay
// has acknowledged every row that is due and idleSettle has passed.
func (b *bencher) idleQueries(ctx context.Context, d time.Duration) (float64, error) {
	for {
		var pending int
		if err := b.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL"+
			" AND (available_at IS NULL OR available_at <= UTC_TIMESTAMP(6))").Scan(&pending); err != nil {
			return 0, fmt.Errorf("idle: count pending rows: %w", err)
		}
		if pending == 0 {
			break
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	select {
	case <-time.After(idleSettle):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
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
		if err := b.writeTxn(ctx, msgs); err != nil {
			return err
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

// startRelay starts the relay under test in mode, with extra flags after
// bench's own (and before cfg.RelayFlags).
func (b *bencher) startRelay(ctx context.Context, mode string, extra ...string) (*relayProc, error) {
	return b.startRelayBinary(ctx, b.cfg.RelayBinary, mode, extra...)
}

func (b *bencher) startRelayBinary(ctx context.Context, binary, mode string, extra ...string) (*relayProc, error) {
	args := []string{"run", "--mysql-dsn", b.cfg.MySQLDSN, "--amqp-url", b.cfg.AMQPURL,
		"--relay-name", relayName, "--default-exchange", b.exchange, "--log-format", "console", "--metrics-addr", "127.0.0.1:0",
		"--confirm-window", fmt.Sprint(b.cfg.ConfirmWindow), "--mode", mode}
	o := b.cfg.AMQPOptions
	for _, f := range [][2]string{
		{"--amqp-tls-ca", o.TLSCA}, {"--amqp-tls-cert", o.TLSCert}, {"--amqp-tls-key", o.TLSKey}, {"--amqp-password-file", o.PasswordFile},
		{"--mysql-tls-ca", b.cfg.MySQL.TLSCA}, {"--mysql-tls-cert", b.cfg.MySQL.TLSCert},
		{"--mysql-tls-key", b.cfg.MySQL.TLSKey}, {"--mysql-password-file", b.cfg.MySQL.PasswordFile},
	} {
		if f[1] != "" {
			args = append(args, f[0], f[1])
		}
	}
	args = append(args, extra...)
	args = append(args, b.cfg.RelayFlags...)
	cmd := exec.CommandContext(ctx, binary, args...)
	b.logs.Reset()
	cmd.Stdout, cmd.Stderr = b.logs, b.logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start relay %s: %w", binary, err)
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
// channel with the same confirm window, and returns msgs/s until the queue
// held them all (toQueue), measured exactly as the relay's catch-up.
func (b *bencher) bare(ctx context.Context, run int, live bool) (float64, error) {
	conn, err := publish.Dial(ctx, b.cfg.firstURL(), b.cfg.AMQPOptions, "outbox-relay bench bare publisher")
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	payload := bytes.Repeat([]byte("x"), b.cfg.PayloadBytes)
	published := make(chan error, 1)
	phase := fmt.Sprintf("run %d: bare publisher", run)
	if live {
		phase += " to a live consumer"
	}
	started := false
	rate, _, err := b.toQueue(ctx, phase, live, func() error { // the bare publisher sends each once
		started = true
		go func() {
			// One channel with at most ConfirmWindow unconfirmed, like
			// each relay lane.
			published <- PublishBare(ctx, conn, b.exchange, "backlog", 1, b.cfg.Backlog, b.cfg.ConfirmWindow, func(i int) amqp.Publishing {
				return relayShaped(fmt.Sprintf("bare-%d", i), i, fmt.Sprintf("p%d", i%1000), payload)
			})
		}()
		return nil
	})
	if err != nil {
		conn.Close() // ends a publisher still waiting for confirms
	}
	if started { // else toQueue failed before publishing: nothing to wait for
		if perr := <-published; perr != nil && err == nil {
			err = fmt.Errorf("bare publisher: %w", perr)
		}
	}
	if err != nil {
		return 0, err
	}
	return rate, nil
}

// toQueue measures a throughput phase: how fast Backlog messages get into
// the queue, and how many deliveries repeated a message (a publisher that
// sends a message twice). start begins publishing and returns at once.
//
// Without live, the consumer is paused: the phase ends when the queue holds
// Backlog messages (every one routed to and accepted by it), and nothing
// else shares the machine with the publisher measured; the broker keeps
// every message, as it does when a backlog outruns its consumers. Then,
// untimed, the consumer resumes and every message must arrive; what the
// queue held beyond them are the repeats. (A repeat counts in the queue's
// depth: a publisher sending repeats ends its phase early, and shows them.)
//
// With live, a consumer drains the queue as fast as it can while the phase
// runs, and the phase ends when it has received every message: the broker
// hands messages on instead of keeping them, and the consumer takes its
// share of the machine's two cores.
func (b *bencher) toQueue(ctx context.Context, phase string, live bool, start func() error) (rate float64, repeats int, err error) {
	return b.toQueueN(ctx, phase, live, b.cfg.Backlog, start, nil)
}

// toQueueN is toQueue for total messages; filled, when not nil, runs as
// soon as the timed part ends (before the check), to read CPU counters.
func (b *bencher) toQueueN(ctx context.Context, phase string, live bool, total int, start, filled func() error) (rate float64, repeats int, err error) {
	if err := b.cons.purge(); err != nil {
		return 0, 0, err
	}
	progress := func(n int) { b.bar(phase, n, total) }
	if live {
		b.cons.expect(total)
		t0 := time.Now()
		err := start()
		if err == nil {
			err = b.cons.wait(ctx, 10*time.Minute, progress)
		}
		if err != nil {
			return 0, 0, err
		}
		rate = float64(total) / time.Since(t0).Seconds()
		repeats, err = b.cons.repeats()
		return rate, repeats, err
	}
	if err := b.cons.pause(); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	err = start()
	if err == nil {
		err = b.cons.waitDepth(ctx, total, 10*time.Minute, progress)
	}
	elapsed := time.Since(t0)
	if err == nil && filled != nil {
		err = filled()
	}
	b.cons.expect(total)
	if rerr := b.cons.resume(); err == nil {
		err = rerr
	}
	if err != nil {
		return 0, 0, err
	}
	if err := b.cons.wait(ctx, 10*time.Minute, func(n int) { b.bar(phase+": check", n, total) }); err != nil {
		return 0, 0, fmt.Errorf("after the queue filled: %w", err)
	}
	repeats, err = b.cons.repeats()
	return float64(total) / elapsed.Seconds(), repeats, err
}

func machine(ctx context.Context, db *sql.DB) string {
	var version string
	_ = db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version)
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%s, %d cores, %s, MySQL %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), host, version)
}
