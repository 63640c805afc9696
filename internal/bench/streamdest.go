package bench

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/publish"
	"github.com/outbox-relay/outbox-relay/streams"
)

// The stream destination's bench (Config.StreamPartitions): per run and
// relay mode, commit → receive latency beside the bare stream producer's
// publish → receive latency, and the catch-up of the backlog into the
// partition streams to a consumer reading them; per run, the bare stream
// producer's catch-up of the same backlog into the same number of
// partitions with the same window. Each phase has partition streams of its
// own, new (so a consumer reading from the first offset sees the phase's
// messages alone, and the bare producer's publishing ids start at 1), and
// deleted when it ends.

// streamBase is the stream destination of bench's own connections: the
// first AMQP URL's broker on the stream port, as the relay derives it from
// --amqp-url (with the same password file and TLS files).
func (c *Config) streamBase() (streams.Config, error) {
	u, err := streams.FromAMQP(c.firstURL())
	if err != nil {
		return streams.Config{}, err
	}
	o := c.AMQPOptions
	return streams.Config{URL: u, Partitions: c.StreamPartitions, PasswordFile: o.PasswordFile,
		TLS: publish.ConnOptions{TLSCA: o.TLSCA, TLSCert: o.TLSCert, TLSKey: o.TLSKey}}, nil
}

// streamPhase declares the new partition streams of one phase (named after
// the bench's exchange and a sequence number), attaches a stream consumer
// that counts into b.cons, runs fn with their destination, and then closes
// the consumer and deletes the streams, whatever fn returned.
func (b *bencher) streamPhase(ctx context.Context, fn func(sc streams.Config) error) (err error) {
	b.streamSeq++
	sc := b.streamCfg
	sc.Stream = b.exchange + "-s" + strconv.Itoa(b.streamSeq)
	declared := 0
	defer func() {
		for i := range declared {
			if derr := b.streamEnv.DeleteStream(sc.PartitionName(i)); derr != nil && err == nil {
				err = fmt.Errorf("bench: delete stream %s: %w", sc.PartitionName(i), derr)
			}
		}
	}()
	for i := range sc.Partitions {
		if err := b.streamEnv.DeclareStream(sc.PartitionName(i), nil); err != nil {
			return fmt.Errorf("bench: declare stream %s: %w", sc.PartitionName(i), err)
		}
		declared++
	}
	cons, err := consumeStreams(sc, b.cons)
	if err != nil {
		return err
	}
	defer cons.close()
	return fn(sc)
}

// streamFlags are the relay's flags for the destination sc.
func streamFlags(sc streams.Config) []string {
	return []string{"--stream", sc.Stream, "--stream-partitions", strconv.Itoa(sc.Partitions)}
}

// runStreams measures the stream destination cfg.Runs times into res.Stream.
func (b *bencher) runStreams(ctx context.Context, res *Result) error {
	samples := map[string]map[string][]float64{}
	var bare, barePub []float64
	for run := 1; run <= b.cfg.Runs; run++ {
		for _, mode := range b.cfg.Modes {
			s, err := b.streamRunOnce(ctx, mode, run)
			if err != nil {
				return fmt.Errorf("bench: streams, %s run %d: %w", mode, run, err)
			}
			if samples[mode] == nil {
				samples[mode] = map[string][]float64{}
			}
			for k, v := range s {
				samples[mode][k] = append(samples[mode][k], v)
			}
		}
		pubRate, rate, err := b.bareStreamCatchUp(ctx, run)
		if err != nil {
			return fmt.Errorf("bench: bare stream producer run %d: %w", run, err)
		}
		bare, barePub = append(bare, rate), append(barePub, pubRate)
		for _, mode := range b.cfg.Modes {
			s := samples[mode]
			n := len(s["catch_up"])
			s["ratio"] = append(s["ratio"], s["catch_up"][n-1]/rate)
			s["ratio_published"] = append(s["ratio_published"], s["catch_up_published"][n-1]/pubRate)
		}
	}
	b.progress("")
	res.Stream = &StreamResult{Partitions: b.cfg.StreamPartitions, BareMsgsPerS: statOf(bare), BarePublishedMsgsPerS: statOf(barePub), Modes: map[string]StreamModeResult{}}
	for mode, s := range samples {
		res.Stream.Modes[mode] = StreamModeResult{
			Latency:                  latencyOf(s),
			CatchUpPublishedMsgsPerS: statOf(s["catch_up_published"]), RatioToBarePublished: statOf(s["ratio_published"]),
			CatchUpMsgsPerS: statOf(s["catch_up"]), RatioToBare: statOf(s["ratio"]), CatchUpRepeats: statOf(s["repeats"]),
			RelayCPUSeconds: statOf(s["cpu"]), RelayPeakRSSMiB: statOf(s["rss"]),
		}
	}
	return nil
}

// streamRunOnce measures one mode into the streams once: the bare stream
// producer's latency, then the relay's, on one phase's streams; then the
// relay's catch-up of the backlog on new ones.
func (b *bencher) streamRunOnce(ctx context.Context, mode string, run int) (map[string]float64, error) {
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	var cpu, rss float64
	err := b.streamPhase(ctx, func(sc streams.Config) error {
		relay, err := b.startRelay(ctx, mode, streamFlags(sc)...)
		if err != nil {
			return err
		}
		defer relay.kill()
		if err := b.probe(ctx); err != nil {
			return fmt.Errorf("relay not delivering into the streams (log follows):\n%s: %w", b.logs.String(), err)
		}
		bareLat, err := b.bareStreamLatency(ctx, sc, fmt.Sprintf("%s run %d: bare stream producer latency", mode, run))
		if err != nil {
			return err
		}
		slices.Sort(bareLat)
		out["bare_p50"], out["bare_p99"] = percentileMs(bareLat, 0.50), percentileMs(bareLat, 0.99)
		lat, commits, err := b.latency(ctx, fmt.Sprintf("%s run %d: latency into the streams", mode, run))
		if err != nil {
			return err
		}
		slices.Sort(lat)
		out["p50"], out["p95"], out["p99"] = percentileMs(lat, 0.50), percentileMs(lat, 0.95), percentileMs(lat, 0.99)
		out["max"] = percentileMs(lat, 1)
		slices.Sort(commits)
		out["commit_p99"], out["commit_max"] = percentileMs(commits, 0.99), percentileMs(commits, 1)
		if cpu, rss, err = procUsage(relay.cmd.Process.Pid); err != nil {
			return err
		}
		return relay.stop()
	})
	if err != nil {
		return nil, err
	}

	phase := fmt.Sprintf("%s run %d: catch-up into the streams", mode, run)
	if err := b.writeBacklog(ctx, phase+": writing backlog"); err != nil {
		return nil, err
	}
	err = b.streamPhase(ctx, func(sc streams.Config) error {
		var relay *relayProc
		var err error
		out["catch_up_published"], out["catch_up"], out["repeats"], err = b.toStreams(ctx, phase, func() error {
			relay, err = b.startRelay(ctx, mode, streamFlags(sc)...)
			return err
		}, func() (bool, error) { return b.acknowledged(ctx) })
		if relay != nil {
			defer relay.kill()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", phase, err)
		}
		c, r, err := procUsage(relay.cmd.Process.Pid)
		if err != nil {
			return err
		}
		cpu, rss = cpu+c, max(rss, r)
		return relay.stop()
	})
	if err != nil {
		return nil, err
	}
	out["cpu"], out["rss"] = cpu, rss
	return out, nil
}

// toStreams measures a catch-up into the streams: start begins publishing
// cfg.Backlog messages and returns at once; published reports whether the
// publisher is done (the relay has acknowledged every row, the bare
// producer has every message confirmed), polled every 20 ms. It returns
// msgs/s until published, msgs/s until the stream consumer has received
// every message (each must arrive within 10 minutes), and the deliveries
// that repeated a message by then.
//
// A stream stores every message whether or not it is read, so the consumer
// reads throughout, for the relay and the bare producer alike: it takes its
// share of the machine in both. The first rate is the publisher's work;
// the second ends at the one event both phases share, but a consumer that
// falls behind the tail reads stored chunks, which the broker serves
// slower than it takes them (docs/benchmarks.md), and bounds it.
func (b *bencher) toStreams(ctx context.Context, phase string, start func() error, published func() (bool, error)) (pubRate, rate, repeats float64, err error) {
	total := b.cfg.Backlog
	b.cons.expect(total)
	t0 := time.Now()
	if err := start(); err != nil {
		return 0, 0, 0, err
	}
	deadline := t0.Add(10 * time.Minute)
	for {
		done, err := published()
		if err != nil {
			return 0, 0, 0, err
		}
		if done {
			break
		}
		b.bar(phase+": publishing", b.cons.count(), total)
		if time.Now().After(deadline) {
			return 0, 0, 0, fmt.Errorf("%s: not all published within 10 minutes", phase)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return 0, 0, 0, ctx.Err()
		}
	}
	pubRate = float64(total) / time.Since(t0).Seconds()
	if err := b.cons.wait(ctx, time.Until(deadline), func(n int) { b.bar(phase+": to the consumer", n, total) }); err != nil {
		return 0, 0, 0, err
	}
	rate = float64(total) / time.Since(t0).Seconds()
	return pubRate, rate, float64(b.cons.repeatedSoFar()), nil
}

// acknowledged reports whether the relay has acknowledged every row: none
// is left undelivered in the outbox (deleted, or marked with
// --on-delivered=mark).
func (b *bencher) acknowledged(ctx context.Context) (bool, error) {
	var one int
	err := b.db.QueryRowContext(ctx, "SELECT 1 FROM outbox WHERE delivered_at IS NULL LIMIT 1").Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("look for rows the relay has not acknowledged: %w", err)
	}
	return false, nil
}

// bareStreamLatency publishes at cfg.Rate for cfg.Duration from the bare
// stream producer into sc's partitions (message i with the latency phase's
// partition key p<i%64>, into that key's partition), with the relay's message
// shape, and returns each message's publish → receive time: what the broker
// and the consumer alone add, at that moment, to the relay's figures.
func (b *bencher) bareStreamLatency(ctx context.Context, sc streams.Config, phase string) (_ []time.Duration, err error) {
	bare, err := openBareStreams(sc, b.cfg.ConfirmWindow)
	if err != nil {
		return nil, err
	}
	defer bare.close()
	payload := bytes.Repeat([]byte("x"), b.cfg.PayloadBytes)
	lats, err := b.paced(ctx, phase, func(i int) error {
		id, key := fmt.Sprintf("bare-latency-%d", i), fmt.Sprintf("p%d", i%64)
		b.cons.sent(id, time.Now())
		return bare.send(ctx, streams.Partition(key, id, sc.Partitions), streamShaped(id, i, key, payload, b.exchange, "latency"))
	})
	if err != nil {
		return nil, err
	}
	return lats, bare.flush(ctx)
}

// bareStreamCatchUp publishes cfg.Backlog messages like the relay's for the
// backlog (same size, properties and partition keys p<i%1000>, each into
// its key's partition) from the bare stream producer, a goroutine per
// partition, and returns msgs/s until the consumer received them all
// (toStreams), measured as the relay's catch-up is; and msgs/s until every
// message was confirmed.
func (b *bencher) bareStreamCatchUp(ctx context.Context, run int) (pubRate, rate float64, err error) {
	err = b.streamPhase(ctx, func(sc streams.Config) error {
		bare, err := openBareStreams(sc, b.cfg.ConfirmWindow)
		if err != nil {
			return err
		}
		defer bare.close()
		payload := bytes.Repeat([]byte("x"), b.cfg.PayloadBytes)
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		published := make(chan error, sc.Partitions)
		started, finished := false, 0
		pubRate, rate, _, err = b.toStreams(ctx, fmt.Sprintf("run %d: bare stream producer", run), func() error {
			started = true
			for part := range sc.Partitions {
				go func() { published <- b.bareStreamPartition(pctx, bare, sc, part, payload) }()
			}
			return nil
		}, func() (bool, error) {
			for finished < sc.Partitions {
				select {
				case perr := <-published:
					finished++
					if perr != nil {
						return false, fmt.Errorf("bare stream producer: %w", perr)
					}
				default:
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			cancel() // ends the partitions' publishers still waiting for a window slot
		}
		if started {
			for ; finished < sc.Partitions; finished++ {
				if perr := <-published; perr != nil && !errors.Is(perr, context.Canceled) && err == nil {
					err = fmt.Errorf("bare stream producer: %w", perr)
				}
			}
		}
		return err
	})
	return pubRate, rate, err
}

// bareStreamPartition publishes the backlog's messages of partition part
// through bare and waits for their confirms.
func (b *bencher) bareStreamPartition(ctx context.Context, bare *bareStreams, sc streams.Config, part int, payload []byte) error {
	for i := range b.cfg.Backlog {
		id, key := fmt.Sprintf("bare-%d", i), fmt.Sprintf("p%d", i%1000)
		if streams.Partition(key, id, sc.Partitions) != part {
			continue
		}
		if err := bare.send(ctx, part, streamShaped(id, i, key, payload, b.exchange, "backlog")); err != nil {
			return err
		}
	}
	return bare.flush1(ctx, part)
}

// openStreamAdmin is bench's connection that declares and deletes the
// phases' streams.
func openStreamAdmin(cfg streams.Config) (*stream.Environment, error) {
	env, err := streams.Environment(cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return env, nil
}
