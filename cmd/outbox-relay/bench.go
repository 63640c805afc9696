package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/bench"
)

func init() {
	register(&command{
		name:    "bench",
		summary: "measure latency, catch-up throughput, idle cost and resources of the relay",
		help: `Runs the relay (this binary, as a subprocess) against --mysql-dsn, which must be a
binlog-enabled server whose database bench may empty, and --amqp-url, and prints
one table: commit → receive latency at --latency-rate for --duration (beside how long
the COMMITs themselves took, and a bare amqp091 publisher's publish → receive
latency at the same rate just before it);
catch-up msg/s on a --backlog of --payload-bytes messages and its ratio to a bare
amqp091 publisher with the same confirm window to the same queue, measured twice:
into the queue with no consumer attached (until the queue holds every message,
which are then consumed and checked: each must arrive, and deliveries that
repeated a message are counted), and to a consumer draining the queue;
database queries per second while idle; relay CPU seconds and peak RSS. Then the
catch-up --shapes (keys1000: 1,000 keys in transactions of 1-5 rows of one key;
bulk100: 100 keys in transactions of 1-100 rows; keys10: 10 keys; hotkey: one key,
whose ceiling is one message per confirm round trip), each beside the bare
publisher at window 1000 and at window = keys, with the CPU seconds of the relay,
the database server and the broker per 10,000 messages. A shape named with
"+full" (keys1000+full) is measured beside one more key whose queue of 50 is kept
full (x-overflow=reject-publish, no consumer) while its producer writes on (a row
after every 64 of the backlog, and one every 20 ms during the catch-up): its rate
is the other keys', to set beside the shape's own (binlog mode; a poll round
waits for the full key's message in it). Each
figure is the median of --runs runs with min and max. 'make bench' starts a
private binlog-enabled MariaDB for it.

With --stream-partitions N, bench measures the stream destination instead
(run's --stream NAME --stream-partitions N): each phase into N partition
streams of its own, declared by bench on --amqp-url's broker at the stream
port (as run derives --stream-url; the rabbitmq_stream plugin must be on) and
deleted when the phase ends, read from their first offset by bench's stream
consumer. It prints commit → receive latency (beside a bare stream
producer's publish → receive latency at the same rate into the same streams)
and catch-up msg/s of the --backlog until the consumer received every
message, beside the bare stream producer's (rabbitmq-stream-go-client alone:
one producer per partition stream, the same message shape and partition keys,
the same --confirm-window per partition) and their ratio; no idle figures
and no shapes.

With --soak DURATION, bench runs the soak instead: for each of --modes, one
after the other, a relay with the default flags (and --relay-flags) relays a
steady stream of one-row transactions (--soak-rate a second, 0 as fast as the
machine takes; each with a partition key of its own) for DURATION into a queue
that keeps only its newest 10,000 messages. It prints a line at start and every
--soak-report: messages published, the relay's live heap (go_gc_heap_live_bytes,
the lowest of the period) and heap low point, RSS, goroutines, open files, its
connections to the database and the server's Threads_connected, its CPU per
message, and the load average; then per mode each figure at start, after the
first period and at the end, and its slope per million transactions.`,
		setup: setupBench,
	})
}

func setupBench(fs *flag.FlagSet) runFunc {
	cfg := bench.Config{}
	var asJSON bool
	var modes, shapes string
	my := declareMySQL(fs, "root@tcp(127.0.0.1:3308)/bench", "binlog-enabled MySQL/MariaDB `dsn`; its outbox is emptied")
	declareAMQP(fs, &cfg.AMQPURL, &cfg.AMQPOptions, "RabbitMQ `url` amqp://user:pass@host:5672/vhost, or amqps://…:5671/ for TLS; several URLs separated by commas for the nodes of a cluster: the relay under test gets them all, bench's own publisher and consumer use the first")
	fs.StringVar(&modes, "modes", "binlog,poll", "comma-separated relay modes to measure side by side")
	fs.Float64Var(&cfg.Rate, "latency-rate", 500, "messages per second in the latency phase (a target; replay's --rate is a limit)")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "length of the latency phase")
	fs.IntVar(&cfg.Backlog, "backlog", 200_000, "messages in the catch-up backlog")
	fs.IntVar(&cfg.PayloadBytes, "payload-bytes", 256, "payload size")
	fs.IntVar(&cfg.Runs, "runs", 3, "runs; each figure is their median")
	fs.IntVar(&cfg.ConfirmWindow, "confirm-window", 256, "confirm window of each relay lane and of the bare publisher")
	fs.StringVar(&cfg.QueueType, "queue-type", "classic", "type of the bench queue: classic (outbox-bench) or quorum (outbox-bench-quorum; give --amqp-url the cluster's nodes)")
	fs.StringVar(&shapes, "shapes", strings.Join(bench.DefaultShapes, ","),
		"comma-separated catch-up shapes to measure, each beside the bare publisher at window 1000 and at window = keys (empty: none); a name with \"+full\" adds a key whose queue is kept full")
	fs.IntVar(&cfg.ShapeBacklog, "shape-backlog", 50_000, "messages in each shape's backlog (the hot key: a fifth)")
	fs.BoolVar(&cfg.ShapesOnly, "shapes-only", false, "measure the shapes alone: no latency, idle or --backlog catch-up")
	fs.IntVar(&cfg.StreamPartitions, "stream-partitions", 0,
		"measure the stream destination into this many partition streams (declared and deleted by bench) beside a bare stream producer, instead of the AMQP exchange; 0: the AMQP destination")
	fs.StringVar(&cfg.BaselineBinary, "baseline-binary", "", "another outbox-relay build whose catch-up of each shape is measured beside this one's, in the same run")
	var relayFlags string
	fs.StringVar(&relayFlags, "relay-flags", "", "more flags for every relay bench runs, space-separated (e.g. \"--on-delivered=mark\"); the baseline binary's too")
	fs.BoolVar(&asJSON, "json", false, "print JSON instead of the table")
	soak := bench.SoakConfig{}
	fs.DurationVar(&soak.Duration, "soak", 0, "run the soak for this `duration` per mode instead of the measurements above")
	fs.Float64Var(&soak.Rate, "soak-rate", 0, "transactions per second of the soak; 0 is as fast as the machine takes")
	fs.DurationVar(&soak.Report, "soak-report", time.Minute, "how often the soak prints a line and keeps a sample")
	return func(ctx context.Context, inv *invocation) error {
		if err := noArgs(inv, "bench"); err != nil {
			return err
		}
		if err := checkAMQP(cfg.AMQPURL, cfg.AMQPOptions); err != nil {
			return err
		}
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find this executable to run the relay: %w", err)
		}
		cfg.RelayBinary = exe
		cfg.MySQLDSN, cfg.MySQL = my.dsn, my.options()
		cfg.Modes = strings.Split(modes, ",")
		cfg.RelayFlags = strings.Fields(relayFlags)
		if shapes != "" && (cfg.StreamPartitions == 0 || isSet(fs, "shapes")) {
			// The default shapes are the AMQP destination's.
			cfg.Shapes = strings.Split(shapes, ",")
		}
		cfg.Progress = inv.stderr
		if soak.Duration > 0 {
			return runSoak(ctx, inv, cfg, soak, asJSON)
		}
		res, err := bench.Run(ctx, cfg)
		if err != nil {
			return err
		}
		return render(inv.stdout, asJSON, res, func(w io.Writer) error { res.Table(w); return nil })
	}
}

// runSoak runs bench --soak: the report lines on stdout (stderr with
// --json), then the summary.
func runSoak(ctx context.Context, inv *invocation, cfg bench.Config, soak bench.SoakConfig, asJSON bool) error {
	soak.Config, soak.Out = cfg, inv.stdout
	if asJSON {
		soak.Out = inv.stderr
	}
	res, err := bench.Soak(ctx, soak)
	if err != nil {
		return err
	}
	if !asJSON {
		return nil // each mode's summary was printed as it ended
	}
	return render(inv.stdout, true, res, nil)
}
