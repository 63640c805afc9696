package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/publish"
)

// SoakConfig says how to soak the relay: a steady stream of one-row
// transactions for Duration through one relay per mode of Config.Modes,
// one mode after the other, into a queue that keeps only its newest
// SoakMaxLength messages.
type SoakConfig struct {
	Config
	Duration time.Duration // per mode
	// Rate is the transactions per second the writers aim at; 0 writes as
	// fast as the machine takes (Writers connections, each committing as
	// soon as its last commit returned).
	Rate    float64
	Writers int // writer connections; default 2
	// Sample is how often the relay's /metrics and /proc are read; Report
	// how often a line is printed and a sample kept. Defaults 2 s and 1 min.
	Sample, Report time.Duration
	// Out receives a line at start, every Report and at the end of each
	// mode; nil for none.
	Out io.Writer
}

// soakMaxLength is the soak queue's x-max-length: the broker keeps the
// newest messages only, so a soak of millions needs no consumer.
const soakMaxLength = 10_000

// validate fills the soak's defaults and checks the servers' settings.
func (c *SoakConfig) validate() error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	if c.Duration <= 0 {
		return errors.New("bench: soak needs a duration")
	}
	if c.Rate < 0 {
		return fmt.Errorf("bench: soak rate %g: want 0 (as fast as the machine takes) or more", c.Rate)
	}
	if c.Writers <= 0 {
		c.Writers = 2
	}
	if c.Sample <= 0 {
		c.Sample = 2 * time.Second
	}
	if c.Report <= 0 {
		c.Report = time.Minute
	}
	c.Report = max(c.Report, c.Sample)
	return nil
}

// Soak runs the soak of each mode in cfg.Modes, one after the other, and
// returns what each measured. It fails when a relay exits or stops
// answering its /metrics; speed is reported, never asserted.
func Soak(ctx context.Context, cfg SoakConfig) (*SoakResult, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	db, err := openDB(ctx, cfg.Config)
	if err != nil {
		return nil, fmt.Errorf("bench soak: %w", err)
	}
	defer db.Close()
	res := &SoakResult{Machine: machine(ctx, db), Rate: cfg.Rate, DurationS: cfg.Duration.Seconds(),
		PayloadBytes: cfg.PayloadBytes, RelayFlags: cfg.RelayFlags}
	for _, mode := range cfg.Modes {
		name := fmt.Sprintf("outbox-soak-%d-%d", os.Getpid(), time.Now().UnixNano()%1_000_000)
		b := &bencher{cfg: cfg.Config, exchange: name, db: db, logs: &bytes.Buffer{}}
		m, err := b.soakMode(ctx, &cfg, mode)
		if err != nil {
			return nil, fmt.Errorf("bench soak: %s: %w", mode, err)
		}
		res.Modes = append(res.Modes, *m)
	}
	return res, nil
}

// soakQueue declares the soak's exchange and its queue of at most
// soakMaxLength messages (the oldest dropped), bound to every routing key,
// and returns a function that deletes both.
func (b *bencher) soakQueue(ctx context.Context) (cleanup func(), err error) {
	conn, err := publish.Dial(ctx, b.cfg.firstURL(), b.cfg.AMQPOptions, "outbox-relay bench soak")
	if err != nil {
		return nil, fmt.Errorf("soak queue: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.ExchangeDeclare(b.exchange, "topic", true, false, false, false, nil)
	}
	if err == nil {
		_, err = ch.QueueDeclare(b.exchange, true, false, false, false, amqp.Table{"x-max-length": int64(soakMaxLength)})
	}
	if err == nil {
		err = ch.QueueBind(b.exchange, "#", b.exchange, false, nil)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("declare soak exchange and queue %s: %w", b.exchange, err)
	}
	return func() {
		_, _ = ch.QueueDelete(b.exchange, false, false, false)
		_ = ch.ExchangeDelete(b.exchange, false, false)
		conn.Close()
	}, nil
}

// soakMode soaks one mode: the relay started with its /metrics on a port
// of its own, a probe row published, then the writers and the sampling for
// cfg.Duration, then the writers stopped and the relay stopped cleanly.
func (b *bencher) soakMode(ctx context.Context, cfg *SoakConfig, mode string) (*SoakModeResult, error) {
	cleanup, err := b.soakQueue(ctx)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	b.cfg.RelayFlags = append(append([]string(nil), cfg.RelayFlags...), "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port))
	relay, err := b.startRelay(ctx, mode)
	if err != nil {
		return nil, err
	}
	defer relay.kill()
	probe := newProber(metricsURL, relay.cmd.Process.Pid, b.cfg.MySQLDSN, b.db)
	if err := b.soakReady(ctx, relay, probe); err != nil {
		return nil, fmt.Errorf("relay not delivering (log follows):\n%s: %w", b.logs.String(), err)
	}
	samples, written, err := b.soakRun(ctx, cfg, mode, relay, probe)
	if err != nil {
		return nil, fmt.Errorf("%w (relay log follows):\n%s", err, b.logs.String())
	}
	if err := relay.stop(); err != nil {
		return nil, fmt.Errorf("%w (relay log follows):\n%s", err, b.logs.String())
	}
	m := soakFigures(mode, samples, written)
	m.print(cfg.Out)
	return m, nil
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port for the relay's /metrics: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// soakReady writes one row and waits until the relay counts it published:
// the relay then answers /metrics and delivers.
func (b *bencher) soakReady(ctx context.Context, relay *relayProc, p *prober) error {
	if _, err := outbox.Enqueue(ctx, b.db, outbox.Message{RoutingKey: "soak.probe", Payload: []byte("{}")}); err != nil {
		return fmt.Errorf("write probe: %w", err)
	}
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		m, err := p.scrape(ctx)
		if err == nil && m["outbox_relay_published_total"] >= 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("probe not published within a minute (last /metrics error: %v)", err)
		}
		select {
		case <-tick.C:
		case err := <-relay.done:
			relay.done <- err
			return fmt.Errorf("relay exited: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// soakRun runs the writers for cfg.Duration while sampling the relay, and
// returns the samples kept (one at start, before the writers, then one
// each cfg.Report and one at the end) and the transactions written.
func (b *bencher) soakRun(ctx context.Context, cfg *SoakConfig, mode string, relay *relayProc, p *prober) ([]SoakSample, int64, error) {
	start, err := p.sample(ctx, 0)
	if err != nil {
		return nil, 0, err
	}
	samples := []SoakSample{start}
	printSample(cfg.Out, mode, start, start, nil)
	wctx, stopWriters := context.WithCancel(ctx)
	var written atomic.Int64
	var wg sync.WaitGroup
	werrs := make(chan error, cfg.Writers)
	for w := 0; w < cfg.Writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			werrs <- b.soakWriter(wctx, cfg, w, &written)
		}()
	}
	err = b.soakSample(ctx, cfg, mode, relay, p, &written, &samples, werrs)
	stopWriters()
	wg.Wait()
	close(werrs)
	for werr := range werrs {
		if err == nil && werr != nil && !errors.Is(werr, context.Canceled) {
			err = werr
		}
	}
	if err != nil {
		return nil, 0, err
	}
	return samples, written.Load(), nil
}

// soakSample reads the relay every cfg.Sample until cfg.Duration passed,
// keeping (and printing) a sample every cfg.Report and one at the end (a
// last period shorter than half a report replaces the one before, merged);
// the live heap of a sample kept is the lowest of its period. It returns early on the relay's
// exit, a writer's error or ctx's end.
func (b *bencher) soakSample(ctx context.Context, cfg *SoakConfig, mode string, relay *relayProc, p *prober,
	written *atomic.Int64, samples *[]SoakSample, werrs <-chan error) error {
	t0 := (*samples)[0].At
	end := time.NewTimer(cfg.Duration)
	defer end.Stop()
	tick := time.NewTicker(cfg.Sample)
	defer tick.Stop()
	var low *SoakSample
	for ended := false; !ended; {
		select {
		case <-end.C:
			ended = true
		case err := <-werrs:
			return fmt.Errorf("writer: %w", err)
		case err := <-relay.done:
			relay.done <- err
			return fmt.Errorf("relay exited during the soak: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		s, err := p.sample(ctx, time.Since(t0).Seconds())
		if err != nil {
			return err
		}
		s.Written = written.Load()
		low = lowest(low, s)
		due := time.Since((*samples)[len(*samples)-1].At) >= cfg.Report-cfg.Sample/2
		if ended && !due && len(*samples) > 1 {
			// A last period shorter than half a report: merged into the
			// one before, whose lows it keeps if lower.
			low = lowest(low, (*samples)[len(*samples)-1])
			*samples = (*samples)[:len(*samples)-1]
		}
		if ended || due {
			s.HeapLiveMiB, s.HeapAllocLowMiB = low.HeapLiveMiB, low.HeapAllocLowMiB
			printSample(cfg.Out, mode, (*samples)[0], s, &(*samples)[len(*samples)-1])
			*samples = append(*samples, s)
			low = nil
		}
	}
	return nil
}

// lowest keeps the lowest live heap and heap-alloc low point seen in a
// report period.
func lowest(low *SoakSample, s SoakSample) *SoakSample {
	if low == nil {
		return &s
	}
	low.HeapLiveMiB = min(low.HeapLiveMiB, s.HeapLiveMiB)
	low.HeapAllocLowMiB = min(low.HeapAllocLowMiB, s.HeapAllocLowMiB)
	return low
}

// soakWriter commits one-row transactions until ctx ends: as fast as it
// can when cfg.Rate is 0, else at its share of cfg.Rate. Every transaction
// has a partition key of its own (a relay that keeps state per key without
// pruning it grows with the soak) and one of 1,000 routing keys.
func (b *bencher) soakWriter(ctx context.Context, cfg *SoakConfig, w int, written *atomic.Int64) error {
	payload := bytes.Repeat([]byte("x"), cfg.PayloadBytes)
	var interval time.Duration
	if cfg.Rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(cfg.Writers) / cfg.Rate)
	}
	start := time.Now()
	for i := 0; ; i++ {
		if interval > 0 {
			select {
			case <-time.After(time.Until(start.Add(time.Duration(i) * interval))): // pacing the producer is the point
			case <-ctx.Done():
				return ctx.Err()
			}
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
		n := written.Add(1)
		msg := outbox.Message{PartitionKey: fmt.Sprintf("soak-%d-%d", w, i), RoutingKey: fmt.Sprintf("soak.%d", n%1000), Payload: payload}
		if _, err := outbox.Enqueue(ctx, b.db, msg); err != nil {
			written.Add(-1)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("commit a one-row transaction: %w", err)
		}
	}
}

// loadAvg is /proc/loadavg's three load averages, "" when unreadable.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
