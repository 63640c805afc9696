package bench

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
)

// Shape is a catch-up backlog: Messages rows over Keys partition keys,
// written in transactions of MinRows to MaxRows rows of one key each.
type Shape struct {
	Name             string
	Keys             int
	MinRows, MaxRows int
	Messages         int // 0: Config.ShapeBacklog
	// FullQueue adds a key whose queue is kept full beside the others
	// (a name ending in "+full", see fullSuffix); Keys and Messages count
	// the others only.
	FullQueue bool
}

// DefaultShapes are the shapes `bench` measures by default: many keys in
// small transactions, a few keys in bulk transactions, ten keys, and one
// hot key (whose ceiling is one message per confirm round trip).
var DefaultShapes = []string{"keys1000", "bulk100", "keys10", "hotkey"}

// shapeNamed is one of the known shapes, or one of them with fullSuffix;
// backlog is Config.ShapeBacklog.
func shapeNamed(name string, backlog int) (Shape, error) {
	if base, ok := strings.CutSuffix(name, fullSuffix); ok {
		s, err := shapeNamed(base, backlog)
		s.Name, s.FullQueue = name, true
		return s, err
	}
	switch name {
	case "keys1000":
		return Shape{Name: name, Keys: 1000, MinRows: 1, MaxRows: 5, Messages: backlog}, nil
	case "bulk100":
		return Shape{Name: name, Keys: 100, MinRows: 1, MaxRows: 100, Messages: backlog}, nil
	case "keys10":
		return Shape{Name: name, Keys: 10, MinRows: 1, MaxRows: 5, Messages: backlog}, nil
	case "hotkey":
		// One message per confirm round trip: a fifth of the backlog keeps
		// the phase as long as the others.
		return Shape{Name: name, Keys: 1, MinRows: 1, MaxRows: 5, Messages: max(backlog/5, 1)}, nil
	}
	return Shape{}, fmt.Errorf("unknown shape %q (known: %s, each also with %q)", name, strings.Join(DefaultShapes, ", "), fullSuffix)
}

func (s Shape) describe() string {
	d := fmt.Sprintf("%s: %d msgs, %d keys, txns of %d-%d rows of one key", s.Name, s.Messages, s.Keys, s.MinRows, s.MaxRows)
	if s.FullQueue {
		d += fmt.Sprintf(", beside a key whose queue of %d is kept full", fullQueueLength)
	}
	return d
}

// ShapeResult is what one shape measured, over the runs.
type ShapeResult struct {
	Shape    string `json:"shape"`
	Messages int    `json:"messages"`
	Keys     int    `json:"keys"`
	// The bare amqp091 publisher on one channel at window 1000, and at
	// window = Keys: the most a relay with one unconfirmed message per key
	// can have on the wire.
	Bare1000MsgsPerS        Stat `json:"bare_window_1000_msgs_per_s"`
	BareKeysMsgsPerS        Stat `json:"bare_window_keys_msgs_per_s"`
	BareBrokerCPUPer10k     Stat `json:"bare_window_1000_broker_cpu_s_per_10k"`
	BareKeysBrokerCPUPer10k Stat `json:"bare_window_keys_broker_cpu_s_per_10k"`
	// The bare publisher's own CPU (this process) per 10,000 messages, and
	// the share of the machine's cores busy, at window = Keys: with the
	// relay mode's figures they tell whether a catch-up was bound by the
	// machine's CPU (busy near 100) and which process spent it.
	BareKeysPublisherCPUPer10k Stat                       `json:"bare_window_keys_publisher_cpu_s_per_10k"`
	BareKeysMachineBusyPct     Stat                       `json:"bare_window_keys_machine_busy_pct"`
	Modes                      map[string]ShapeModeResult `json:"modes"`
}

// ShapeModeResult is one relay mode's catch-up of a shape.
type ShapeModeResult struct {
	MsgsPerS        Stat `json:"msgs_per_s"`
	RatioToBare1000 Stat `json:"ratio_to_bare_window_1000"`
	RatioToBareKeys Stat `json:"ratio_to_bare_window_keys"`
	// CPU seconds per 10,000 messages during the catch-up (start of the
	// relay until the queue held every message); NaN where the process
	// could not be found on this machine.
	RelayCPUPer10k  Stat `json:"relay_cpu_s_per_10k"`
	DBCPUPer10k     Stat `json:"db_server_cpu_s_per_10k"`
	BrokerCPUPer10k Stat `json:"broker_cpu_s_per_10k"`
	RelayPeakRSSMiB Stat `json:"relay_peak_rss_mib"`
	// MachineBusyPct is the share of the machine's cores busy during the
	// catch-up, every process counted.
	MachineBusyPct Stat `json:"machine_busy_pct"`
	// Repeats is how many deliveries repeated a message (0 expected: the
	// relay repeats only what was unconfirmed at a fault).
	Repeats Stat `json:"repeats"`
}

// writeShape writes s's backlog while no relay runs. Thousands of small
// transactions would each wait for a log flush: the server flushes its redo
// log once a second meanwhile (innodb_flush_log_at_trx_commit = 2, on the
// bench's own server, where bench may; the setting is restored after).
func (b *bencher) writeShape(ctx context.Context, s Shape, phase string) error {
	var flush int
	if err := b.db.QueryRowContext(ctx, "SELECT @@GLOBAL.innodb_flush_log_at_trx_commit").Scan(&flush); err == nil && flush != 2 {
		if _, err := b.db.ExecContext(ctx, "SET GLOBAL innodb_flush_log_at_trx_commit = 2"); err == nil {
			defer func() {
				_, _ = b.db.ExecContext(context.WithoutCancel(ctx), fmt.Sprintf("SET GLOBAL innodb_flush_log_at_trx_commit = %d", flush))
			}()
		}
	}
	// The transactions are drawn first (the same backlog every run), then
	// written by a few connections at once.
	rng := rand.New(rand.NewPCG(uint64(s.Keys), uint64(s.MaxRows)))
	var sizes []int
	fullAfter := map[int]bool{} // transactions followed by a row of fullKey
	for done := 0; done < s.Messages; {
		n := min(s.MinRows+rng.IntN(s.MaxRows-s.MinRows+1), s.Messages-done)
		if s.FullQueue && (done+n)/fullEvery > done/fullEvery {
			fullAfter[len(sizes)] = true
		}
		sizes = append(sizes, n)
		done += n
	}
	payload := bytes.Repeat([]byte("x"), b.cfg.PayloadBytes)
	const writers = 4
	var next, written atomic.Int64
	errs := make(chan error, writers)
	for range writers {
		go func() {
			msgs := make([]outbox.Message, 0, s.MaxRows)
			for {
				txn := int(next.Add(1) - 1)
				if txn >= len(sizes) || ctx.Err() != nil {
					errs <- nil
					return
				}
				msgs = msgs[:0]
				for range sizes[txn] {
					msgs = append(msgs, outbox.Message{PartitionKey: fmt.Sprintf("p%d", txn%s.Keys), RoutingKey: "backlog", Payload: payload})
				}
				if err := b.writeTxn(ctx, msgs); err != nil {
					errs <- err
					return
				}
				if fullAfter[txn] {
					if err := b.writeTxn(ctx, []outbox.Message{b.fullRow()}); err != nil {
						errs <- err
						return
					}
				}
				written.Add(int64(len(msgs)))
			}
		}()
	}
	var firstErr error
	tick := time.NewTicker(250 * time.Millisecond) // redraws the progress bar
	defer tick.Stop()
	for left := writers; left > 0; {
		select {
		case err := <-errs:
			left--
			if err != nil && firstErr == nil {
				firstErr = err
				next.Store(int64(len(sizes))) // the others stop
			}
		case <-tick.C:
		}
		b.bar(phase, int(written.Load()), s.Messages)
	}
	return firstErr
}

// writeTxn writes msgs in one transaction.
func (b *bencher) writeTxn(ctx context.Context, msgs []outbox.Message) error {
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
	return nil
}

// cpuMeter reads the CPU seconds of the database server and the broker
// when they run on this machine, of this process (the bare publisher), and
// of the whole machine.
type cpuMeter struct{ dbPID, brokerPID int }

// cpuSample is one reading of cpuMeter; NaN where a process was not found.
type cpuSample struct {
	db, broker, self float64
	busy             float64 // CPU seconds of every process on the machine (all cores), from /proc/stat
	at               time.Time
}

func (m cpuMeter) read() cpuSample {
	read := func(pid int) float64 {
		if pid == 0 {
			return math.NaN()
		}
		v, err := procCPU(pid)
		if err != nil {
			return math.NaN()
		}
		return v
	}
	return cpuSample{db: read(m.dbPID), broker: read(m.brokerPID), self: read(os.Getpid()), busy: machineBusy(), at: time.Now()}
}

// busyPct is the share of the machine's cores that were busy between a
// and b, in percent.
func busyPct(a, b cpuSample) float64 {
	return (b.busy - a.busy) / (b.at.Sub(a.at).Seconds() * float64(runtime.NumCPU())) * 100
}

// shapeOnce measures shape s once: the bare publisher at window 1000 and
// at window = keys, then each relay mode's catch-up of the same backlog.
// It adds each figure to samples.
func (b *bencher) shapeOnce(ctx context.Context, s Shape, run int, m cpuMeter, samples map[string]map[string][]float64) error {
	add := func(mode, fig string, v float64) {
		if math.IsNaN(v) {
			return // a process not found here: the figure stays 0
		}
		if samples[mode] == nil {
			samples[mode] = map[string][]float64{}
		}
		samples[mode][fig] = append(samples[mode][fig], v)
	}
	per10k := func(v float64) float64 { return v / float64(s.Messages) * 10_000 }
	bare1000, bareKeys, err := b.bareOnce(ctx, s, run, m, add, per10k)
	if err != nil {
		return err
	}
	var relays []relayRun
	for _, mode := range b.cfg.Modes {
		relays = append(relays, relayRun{mode, b.cfg.RelayBinary, mode})
		if b.cfg.BaselineBinary != "" {
			relays = append(relays, relayRun{mode + " baseline", b.cfg.BaselineBinary, mode})
		}
	}
	for _, rr := range relays {
		f, err := b.relayShape(ctx, s, run, rr, m)
		if err != nil {
			return err
		}
		mode := rr.label
		add(mode, "rate", f.rate)
		add(mode, "ratio1000", f.rate/bare1000)
		add(mode, "ratiokeys", f.rate/bareKeys)
		add(mode, "relay_cpu", per10k(f.relayCPU))
		add(mode, "db_cpu", per10k(f.c1.db-f.c0.db))
		add(mode, "broker_cpu", per10k(f.c1.broker-f.c0.broker))
		add(mode, "busy", busyPct(f.c0, f.c1))
		add(mode, "rss", f.rss)
		add(mode, "repeats", float64(f.repeats))
	}
	return nil
}

// relayRun is a relay build and mode a shape is measured with; label
// names its figures.
type relayRun struct{ label, binary, mode string }

// shapeFigures is what one relay's catch-up of a shape measured.
type shapeFigures struct {
	rate          float64
	repeats       int
	relayCPU, rss float64
	c0, c1        cpuSample // the machine's counters at the start and the end of the catch-up
}

// relayShape measures rr's catch-up of shape s once: the backlog written
// while no relay runs, then the relay started and timed until the queue
// holds every message. For a "+full" shape the full queue is filled
// first, its key's producer writes on during the catch-up, the queue must
// still be full at its end, and it is dropped before the relay stops.
func (b *bencher) relayShape(ctx context.Context, s Shape, run int, rr relayRun, m cpuMeter) (f shapeFigures, err error) {
	phase := fmt.Sprintf("%s run %d %s: catch-up", rr.label, run, s.Name)
	if err := b.prime(ctx, rr.binary, rr.mode); err != nil {
		return f, fmt.Errorf("%s: %w", phase, err)
	}
	if s.FullQueue {
		if err := b.full.fill(); err != nil {
			return f, fmt.Errorf("%s: %w", phase, err)
		}
	}
	if err := b.writeShape(ctx, s, phase+": writing backlog"); err != nil {
		return f, err
	}
	var relay *relayProc
	stopFull := func() error { return nil }
	f.rate, f.repeats, err = b.toQueueN(ctx, phase, false, s.Messages, func() error {
		var err error
		f.c0 = m.read()
		relay, err = b.startRelayBinary(ctx, rr.binary, rr.mode)
		if err == nil && s.FullQueue {
			stopFull = b.writeFull(ctx)
		}
		return err
	}, func() error {
		var err error
		f.c1 = m.read()
		f.relayCPU, f.rss, err = procUsage(relay.cmd.Process.Pid)
		if err == nil && s.FullQueue {
			err = b.checkFull()
		}
		return err
	})
	if ferr := stopFull(); err == nil {
		err = ferr
	}
	if relay != nil {
		defer relay.kill()
	}
	if err != nil {
		return f, fmt.Errorf("%s: %w (relay log follows)\n%s", phase, err, b.logs.String())
	}
	if s.FullQueue {
		if err := b.full.drop(); err != nil {
			return f, fmt.Errorf("%s: %w", phase, err)
		}
	}
	return f, relay.stop()
}

// prime empties the outbox and runs the relay until it delivered a probe
// message, then stops it: it stored its position, so the next start
// catches up from there (from the binlog in binlog mode). A first start
// would deliver the rows pending then by polling instead (docs/operations.md,
// "Modes"), which is not the catch-up measured.
func (b *bencher) prime(ctx context.Context, binary, mode string) error {
	if err := b.reset(ctx); err != nil {
		return err
	}
	relay, err := b.startRelayBinary(ctx, binary, mode)
	if err != nil {
		return err
	}
	defer relay.kill()
	// The first probes may be delivered by the first start's sweep: the
	// position is stored once the relay acknowledged one from the binlog.
	deadline := time.Now().Add(time.Minute)
	for {
		if err := b.probe(ctx); err != nil {
			return fmt.Errorf("relay not delivering (log follows):\n%s: %w", b.logs.String(), err)
		}
		var stored bool
		if err := b.db.QueryRowContext(ctx, "SELECT COALESCE(gtid_set, binlog_file) IS NOT NULL FROM outbox_relay_progress WHERE relay_name = ?",
			relayName).Scan(&stored); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("read the relay's stored position: %w", err)
		}
		if stored || mode == "poll" {
			return relay.stop()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the relay stored no position within a minute of probes (log follows):\n%s", b.logs.String())
		}
		select {
		case <-time.After(100 * time.Millisecond): // the acknowledgement follows the delivery
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// bareShape publishes s.Messages messages shaped like the relay's for s
// (the partition key of message i is key i % s.Keys) from one channel with
// at most window unconfirmed, and returns msgs/s until the queue held them.
func (b *bencher) bareShape(ctx context.Context, phase string, s Shape, window int, filled func() error) (float64, error) {
	conn, err := publish.Dial(ctx, b.cfg.firstURL(), b.cfg.AMQPOptions, "outbox-relay bench bare publisher")
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	payload := bytes.Repeat([]byte("x"), b.cfg.PayloadBytes)
	published := make(chan error, 1)
	started := false
	rate, _, err := b.toQueueN(ctx, phase, false, s.Messages, func() error { // the bare publisher sends each once
		started = true
		go func() {
			published <- PublishBare(ctx, conn, b.exchange, "backlog", 1, s.Messages, window, func(i int) amqp.Publishing {
				return relayShaped(fmt.Sprintf("bare-%d", i), i, fmt.Sprintf("p%d", i%s.Keys), payload)
			})
		}()
		return nil
	}, filled)
	if err != nil {
		conn.Close() // ends a publisher still waiting for confirms
	}
	if started {
		if perr := <-published; perr != nil && err == nil {
			err = fmt.Errorf("bare publisher: %w", perr)
		}
	}
	return rate, err
}

// shapeResults turns the samples of every run into results.
func shapeResults(shapes []Shape, samples []map[string]map[string][]float64) []ShapeResult {
	out := make([]ShapeResult, 0, len(shapes))
	for i, s := range shapes {
		smp := samples[i]
		r := ShapeResult{Shape: s.Name, Messages: s.Messages, Keys: s.Keys, Modes: map[string]ShapeModeResult{},
			Bare1000MsgsPerS: statOf(smp["bare"]["w1000"]), BareKeysMsgsPerS: statOf(smp["bare"]["wkeys"]),
			BareBrokerCPUPer10k: statOf(smp["bare"]["broker_cpu"]), BareKeysBrokerCPUPer10k: statOf(smp["bare"]["broker_cpu_keys"]),
			BareKeysPublisherCPUPer10k: statOf(smp["bare"]["pub_cpu_keys"]), BareKeysMachineBusyPct: statOf(smp["bare"]["busy_keys"])}
		for mode, f := range smp {
			if mode == "bare" {
				continue
			}
			r.Modes[mode] = ShapeModeResult{MsgsPerS: statOf(f["rate"]), RatioToBare1000: statOf(f["ratio1000"]),
				RatioToBareKeys: statOf(f["ratiokeys"]), RelayCPUPer10k: statOf(f["relay_cpu"]),
				DBCPUPer10k: statOf(f["db_cpu"]), BrokerCPUPer10k: statOf(f["broker_cpu"]), RelayPeakRSSMiB: statOf(f["rss"]),
				Repeats:        statOf(f["repeats"]),
				MachineBusyPct: statOf(f["busy"])}
		}
		out = append(out, r)
	}
	return out
}

// bareOnce measures the bare publisher on shape s at window 1000 and at
// window = keys (once when they are the same), adds their figures to the
// "bare" samples, and returns the two rates.
func (b *bencher) bareOnce(ctx context.Context, s Shape, run int, m cpuMeter, add func(mode, fig string, v float64),
	per10k func(float64) float64) (bare1000, bareKeys float64, _ error) {
	type figures struct{ rate, broker, pub, busy float64 }
	measure := func(window int) (figures, error) {
		phase := fmt.Sprintf("run %d %s: bare window %d", run, s.Name, window)
		c0 := m.read()
		var c1 cpuSample
		rate, err := b.bareShape(ctx, phase, s, window, func() error { c1 = m.read(); return nil })
		if err != nil {
			return figures{}, fmt.Errorf("%s: %w", phase, err)
		}
		return figures{rate, per10k(c1.broker - c0.broker), per10k(c1.self - c0.self), busyPct(c0, c1)}, nil
	}
	w1000, err := measure(1000)
	if err != nil {
		return 0, 0, err
	}
	wkeys := w1000 // the same measurement when keys = 1000
	if s.Keys != 1000 {
		if wkeys, err = measure(s.Keys); err != nil {
			return 0, 0, err
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"w1000", w1000.rate}, {"broker_cpu", w1000.broker}, {"pub_cpu", w1000.pub}, {"busy", w1000.busy},
		{"wkeys", wkeys.rate}, {"broker_cpu_keys", wkeys.broker}, {"pub_cpu_keys", wkeys.pub}, {"busy_keys", wkeys.busy},
	} {
		add("bare", f.name, f.v)
	}
	return w1000.rate, wkeys.rate, nil
}
