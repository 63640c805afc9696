package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/position"
	"github.com/outbox-relay/outbox-relay/replay"
)

func init() {
	register(&command{
		name:    "replay",
		summary: "republish the outbox rows a binlog range inserted (x-replay: true)",
		usage:   "--from-gtid SET | --from-time T [--to-gtid SET | --to-time T] [flags]",
		help: `Reads the binlog range with its own replica server id, next to a running relay
without disturbing it, and publishes every outbox row the range inserted as the
original message (same message-id, properties, headers and payload) plus the
header x-replay: true, with publisher confirms and in binlog order per partition
key. The progress row, the outbox and outbox_failed are not touched; a message
the broker returns or rejects is reported, not stored.

The range: --from-gtid SET starts after SET (a position, like a checkpoint);
--to-gtid SET ends with the transaction that completes SET (inclusive).
--from-time and --to-time are RFC 3339 times (2026-11-23T14:00:00Z), compared
with the binlog event times in whole seconds: the replay starts with the first
transaction at or after --from-time and ends with the last one before the first
transaction after --to-time. Without --to-gtid or --to-time the replay ends at
the server's position when it started. A start the server has purged is
refused with the oldest position available. Rows whose available_at is still
in the future are left to the relay.

Progress goes to stderr (a line with count, rate and ETA on a terminal, a log
line every few seconds otherwise); the summary to stdout. Exit 0 when every
message was confirmed, 1 when some were not (or on a runtime failure), 2 when
the request is refused or bad.`,
		setup: setupReplay,
	})
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

// timeFlag is an RFC 3339 time flag.
type timeFlag struct{ t *time.Time }

func (f timeFlag) String() string {
	if f.t == nil || f.t.IsZero() {
		return ""
	}
	return f.t.Format(time.RFC3339)
}

// Set reads an RFC 3339 time. A time before 1970 counts as
// 1970-01-01T00:00:00Z, where binlog event times start: the zero time.Time
// (0001-01-01T00:00:00Z) would otherwise read as "not given".
func (f timeFlag) Set(s string) error {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return fmt.Errorf("%q is not an RFC 3339 time such as 2026-11-23T14:00:00Z", s)
	}
	if epoch := time.Unix(0, 0).UTC(); t.Before(epoch) {
		t = epoch
	}
	*f.t = t
	return nil
}

// declareReplay declares replay's flags on fs. config returns the replay
// they ask for once fs is parsed (before replay.Config.Validate); an error
// is a usage error.
func declareReplay(fs *flag.FlagSet) (config func() (replay.Config, error), asJSON *bool) {
	var cfg replay.Config
	var keys stringList
	var serverID uint
	asJSON = new(bool)
	my := declareMySQL(fs, defaultDSN, "MySQL/MariaDB `dsn` user:pass@tcp(host:port)/dbname; the user needs REPLICATION SLAVE, REPLICATION CLIENT and SELECT on outbox_relay_progress")
	declareAMQP(fs, &cfg.AMQPURL, &cfg.AMQPOptions, "RabbitMQ `url` amqp://user:pass@host:5672/vhost, or amqps://…:5671/ for TLS; several URLs separated by commas for the nodes of a cluster: the replay connects to the first that answers")
	declareTable(fs, &cfg.Table)
	declareRelayName(fs, &cfg.RelayName, "default", "relay `name` whose current epoch the messages carry in x-relay-epoch (read only)")
	fs.StringVar(&cfg.DefaultExchange, "default-exchange", "", "`exchange` for rows whose exchange column is empty")
	fs.UintVar(&serverID, "replay-server-id", 0, "replica server `id` the replay reads the binlog as; must differ from the relay's --server-id and every other replica's (0 = a random id in 7464000..8463999)")
	fs.StringVar(&cfg.Range.FromGTID, "from-gtid", "", "start after this GTID `set` (a position, like a checkpoint)")
	fs.Var(timeFlag{&cfg.Range.FromTime}, "from-time", "start with the first transaction at or after this RFC 3339 `time` (binlog event time, whole seconds)")
	fs.StringVar(&cfg.Range.ToGTID, "to-gtid", "", "end with the transaction that completes this GTID `set` (inclusive); default: the server's position at the start")
	fs.Var(timeFlag{&cfg.Range.ToTime}, "to-time", "end with the last transaction of this RFC 3339 `time`'s second or before; default: the server's position at the start")
	fs.Var(&keys, "partition-key", "replay only rows of this partition `key` (repeatable)")
	fs.StringVar(&cfg.Filter.RoutingKeyPrefix, "routing-key-prefix", "", "replay only rows whose routing key starts with `prefix`")
	fs.StringVar(&cfg.Filter.MessageType, "message-type", "", "replay only rows of this message `type`")
	fs.StringVar(&cfg.Exchange, "exchange", "", "publish every message to this `exchange` instead of its own")
	fs.BoolVar(&cfg.DryRun, "dry-run", false, "publish nothing; report what would be published")
	fs.Float64Var(&cfg.Rate, "rate", 0, "at most `N` messages per second (0 = unlimited; else at least 0.001)")
	declareJSON(fs, asJSON, "print the summary as a JSON object")
	return func() (replay.Config, error) {
		if serverID > 1<<32-1 {
			return replay.Config{}, usagef("--replay-server-id %d: at most %d", serverID, uint32(1<<32-1))
		}
		c := cfg
		c.ServerID = uint32(serverID)
		c.MySQLDSN, c.MySQLPasswordFile = my.dsn, my.passwordFile
		c.MySQLTLSCA, c.MySQLTLSCert, c.MySQLTLSKey = my.tlsCA, my.tlsCert, my.tlsKey
		c.Filter.PartitionKeys = append([]string(nil), keys...)
		return c, nil
	}, asJSON
}

func setupReplay(fs *flag.FlagSet) runFunc {
	config, asJSON := declareReplay(fs)
	return func(ctx context.Context, inv *invocation) error {
		if err := noArgs(inv, "replay"); err != nil {
			return err
		}
		cfg, err := config()
		if err != nil {
			return err
		}
		cfg.Logger = inv.log
		endProgress := func() {}
		if inv.terminal {
			line := &progressLine{w: inv.stderr}
			cfg.OnProgress, cfg.ProgressInterval, endProgress = line.show, time.Second, line.end
		} else {
			cfg.OnProgress = func(p replay.Progress) { logProgress(inv.log, p) }
		}
		s, err := replay.Run(ctx, cfg)
		endProgress() // the summary starts on a line of its own
		if s != nil {
			if *asJSON {
				if jerr := writeReplayJSON(inv.stdout, s); jerr != nil && err == nil {
					err = jerr
				}
			} else {
				writeReplaySummary(inv.stdout, s)
			}
			inv.log.Info("replay finished", zap.Stringer("summary", s))
		}
		var re *replay.RefusedError
		if errors.As(err, &re) {
			return &usageError{err}
		}
		return err
	}
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressLine is the one updating progress line on a terminal.
type progressLine struct {
	w     io.Writer
	shown bool
}

func (l *progressLine) show(p replay.Progress) {
	fmt.Fprintf(l.w, "\r\x1b[Kreplay: %d messages, %d confirmed, %.0f msg/s", p.Messages, p.Confirmed, p.Rate)
	if p.Done >= 0 {
		fmt.Fprintf(l.w, ", %.0f%% of the range", 100*p.Done)
	}
	if p.ETA >= 0 && !p.Final {
		fmt.Fprintf(l.w, ", ETA %s", p.ETA.Round(time.Second))
	}
	l.shown = true
}

func (l *progressLine) end() {
	if l.shown {
		fmt.Fprintln(l.w)
	}
}

func logProgress(log *zap.Logger, p replay.Progress) {
	fields := []zap.Field{
		zap.Int("messages", p.Messages), zap.Int("confirmed", p.Confirmed),
		zap.Float64("rate", round1(p.Rate)), zap.Stringer("read_up_to", p.Position),
		zap.Duration("elapsed", p.Elapsed.Round(time.Millisecond)),
	}
	if p.Done >= 0 {
		fields = append(fields, zap.Float64("done", round1(100*p.Done)/100))
	}
	if p.ETA >= 0 && !p.Final {
		fields = append(fields, zap.Duration("eta", p.ETA.Round(time.Second)))
	}
	msg := "replay progress"
	if p.Final {
		msg = "replay read the whole range"
	}
	log.Info(msg, fields...)
}

func round1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }

// posText is a position as an operator types it back.
func posText(p position.Position) string {
	switch {
	case p.GTIDSet != "":
		return p.GTIDSet
	case p.File != "":
		return fmt.Sprintf("%s:%d", p.File, p.Pos)
	}
	return ""
}

func writeReplaySummary(w io.Writer, s *replay.Summary) {
	rate := float64(s.Messages) / max(s.Elapsed.Seconds(), 1e-9)
	from, to := posText(s.From), posText(s.To)
	if from == "" {
		from = "(the start of the binlog)"
	}
	switch {
	case s.Empty:
		fmt.Fprintf(w, "nothing to replay: no transaction after %s up to %s\n", from, to)
		return
	case s.DryRun:
		fmt.Fprintf(w, "dry run: %d messages would be replayed (nothing was published)\n", s.Messages)
	default:
		fmt.Fprintf(w, "replayed %d messages in %s (%.0f msg/s)\n", s.Messages, s.Elapsed.Round(time.Millisecond), rate)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  range\tafter %s, up to and including %s\n", from, to)
	if !s.FromTime.IsZero() {
		fmt.Fprintf(tw, "  first event time\t%s\n", s.FromTime.Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "  transactions\t%d", s.Transactions)
	if s.FirstGTID != "" {
		fmt.Fprintf(tw, " (first %s, last %s)", s.FirstGTID, s.LastGTID)
	}
	fmt.Fprintln(tw)
	if !s.DryRun {
		fmt.Fprintf(tw, "  confirmed\t%d\n", s.Confirmed)
		if n := s.NotConfirmed(); n > 0 {
			fmt.Fprintf(tw, "  not confirmed\t%d (%d returned, %d rejected, %d invalid, %d without an outcome)\n",
				n, s.Returned, s.Rejected, s.Invalid, s.Unconfirmed)
		}
	} else if s.Invalid > 0 {
		fmt.Fprintf(tw, "  invalid\t%d (cannot be published as they are)\n", s.Invalid)
	}
	if s.Filtered > 0 {
		fmt.Fprintf(tw, "  filtered out\t%d\n", s.Filtered)
	}
	if s.NotDue > 0 {
		fmt.Fprintf(tw, "  not yet due\t%d (available_at in the future: the relay delivers them when due)\n", s.NotDue)
	}
	if s.Interrupted {
		fmt.Fprintf(tw, "  interrupted\tread up to %s", posText(s.ReadUpTo))
		if s.PartialMessages > 0 {
			fmt.Fprintf(tw, " and %d messages of the next transaction", s.PartialMessages)
		}
		if s.ReadUpTo.GTIDSet != "" {
			fmt.Fprintf(tw, "; continue with --from-gtid %s", s.ReadUpTo.GTIDSet)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	for _, f := range s.Failures {
		fmt.Fprintf(w, "  %s %s (outbox id %d): %s\n", f.Outcome, f.MessageID, f.OutboxID, f.Reason)
	}
	if len(s.Routes) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "EXCHANGE\tROUTING KEY\tMESSAGES")
	const maxLines = 50
	for i, r := range s.Routes {
		if i == maxLines {
			fmt.Fprintf(tw, "(%d more routes)\t\t\n", len(s.Routes)-maxLines)
			break
		}
		ex := r.Exchange
		if ex == "" {
			ex = `""` // the AMQP default exchange
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\n", ex, r.RoutingKey, r.Messages)
	}
	if s.OtherRoutes > 0 {
		fmt.Fprintf(tw, "(other routes)\t\t%d\n", s.OtherRoutes)
	}
	tw.Flush()
}

// replayJSON is the --json summary.
type replayJSON struct {
	DryRun         bool          `json:"dry_run"`
	Messages       int           `json:"messages"`
	From           string        `json:"from"`
	To             string        `json:"to"`
	Empty          bool          `json:"empty"`
	FirstEventTime *time.Time    `json:"first_event_time"`
	FirstGTID      string        `json:"first_gtid"`
	LastGTID       string        `json:"last_gtid"`
	Transactions   int           `json:"transactions"`
	Confirmed      int           `json:"confirmed"`
	Returned       int           `json:"returned"`
	Rejected       int           `json:"rejected"`
	Invalid        int           `json:"invalid"`
	Unconfirmed    int           `json:"unconfirmed"`
	Filtered       int           `json:"filtered"`
	NotDue         int           `json:"not_due"`
	Interrupted    bool          `json:"interrupted"`
	ReadUpTo       string        `json:"read_up_to"`
	PartialMsgs    int           `json:"partial_messages"`
	ElapsedSeconds float64       `json:"elapsed_seconds"`
	Routes         []routeJSON   `json:"routes"`
	OtherRoutes    int           `json:"other_routes"`
	Failures       []failureJSON `json:"failures"`
}

type routeJSON struct {
	Exchange   string `json:"exchange"`
	RoutingKey string `json:"routing_key"`
	Messages   int    `json:"messages"`
}

type failureJSON struct {
	MessageID string `json:"message_id"`
	OutboxID  uint64 `json:"outbox_id"`
	Outcome   string `json:"outcome"`
	Reason    string `json:"reason"`
}

func writeReplayJSON(w io.Writer, s *replay.Summary) error {
	j := replayJSON{
		DryRun: s.DryRun, Messages: s.Messages, From: posText(s.From), To: posText(s.To), Empty: s.Empty,
		FirstGTID: s.FirstGTID, LastGTID: s.LastGTID, Transactions: s.Transactions,
		Confirmed: s.Confirmed, Returned: s.Returned, Rejected: s.Rejected, Invalid: s.Invalid,
		Unconfirmed: s.Unconfirmed, Filtered: s.Filtered, NotDue: s.NotDue,
		Interrupted: s.Interrupted, ReadUpTo: posText(s.ReadUpTo), PartialMsgs: s.PartialMessages,
		ElapsedSeconds: s.Elapsed.Seconds(), OtherRoutes: s.OtherRoutes,
		Routes: []routeJSON{}, Failures: []failureJSON{},
	}
	if !s.FromTime.IsZero() {
		j.FirstEventTime = &s.FromTime
	}
	for _, r := range s.Routes {
		j.Routes = append(j.Routes, routeJSON{r.Exchange, r.RoutingKey, r.Messages})
	}
	for _, f := range s.Failures {
		j.Failures = append(j.Failures, failureJSON{f.MessageID, f.OutboxID, f.Outcome, f.Reason})
	}
	if err := printJSON(w, j); err != nil {
		return fmt.Errorf("write the summary: %w", err)
	}
	return nil
}
