package main

// What the housekeeping commands (failed, cleanup, dedup-cleanup,
// partitions) share, and run's flags for the maintenance its leader does
// (maintenance.Round).

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/maintenance"
	"github.com/outbox-relay/outbox-relay/relay"
)

// ageHelp explains the accepted forms of an age flag.
const ageHelp = "a Go duration (90m, 36h) or whole days (7d, 30d)"

// ageValue is a flag holding a non-negative age: a Go duration or days.
type ageValue struct {
	d   time.Duration
	set bool
}

func newAge(d time.Duration) ageValue { return ageValue{d: d} }

func (a *ageValue) String() string {
	if a == nil || (a.d == 0 && !a.set) {
		return ""
	}
	return formatAge(a.d)
}

func (a *ageValue) Set(s string) error {
	d, err := parseAge(s)
	if err != nil {
		return err
	}
	a.d, a.set = d, true
	return nil
}

// parseAge reads "7d", "1d12h", "36h", "90m", "0".
func parseAge(s string) (time.Duration, error) {
	bad := fmt.Errorf("%q is not an age: use %s", s, ageHelp)
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "-") {
		return 0, fmt.Errorf("%q is negative: an age is %s", s, ageHelp)
	}
	var days int64
	if i := strings.IndexAny(t, "dD"); i >= 0 {
		n, err := strconv.ParseInt(t[:i], 10, 64)
		if err != nil || n > int64(maxAgeDays) {
			return 0, bad
		}
		days, t = n, t[i+1:]
		if t == "" {
			return time.Duration(days) * 24 * time.Hour, nil
		}
	}
	d, err := time.ParseDuration(t)
	if err != nil || d < 0 {
		return 0, bad
	}
	total := time.Duration(days)*24*time.Hour + d
	if total < d {
		return 0, bad // overflow
	}
	return total, nil
}

// maxAgeDays keeps an age in days within a time.Duration.
const maxAgeDays = 100_000

// formatAge prints whole days as "7d", anything else as a Go duration.
func formatAge(d time.Duration) string {
	const day = 24 * time.Hour
	if d > 0 && d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	return d.String()
}

// declareOps declares the flags of the housekeeping command name.
func declareOps(fs *flag.FlagSet, name string) *dbFlags {
	return declareDB(fs, "relay `name`; accepted like run's, though "+name+" works on tables every relay name shares",
		relay.DefaultRelayName, "print one JSON object for scripts instead of text for people")
}

// batchFlags size the delete transactions of a cleanup.
type batchFlags struct {
	size  int
	pause time.Duration
}

func declareBatch(fs *flag.FlagSet) *batchFlags {
	b := &batchFlags{}
	fs.IntVar(&b.size, "batch-size", maintenance.DefaultBatchSize,
		fmt.Sprintf("rows deleted per transaction (1 to %d): a producer waits at most for one batch's commit", maintenance.MaxBatchSize))
	fs.DurationVar(&b.pause, "batch-pause", 0, "pause between batches, e.g. 100ms, to let replicas keep up")
	return b
}

// batch checks the flags and returns the options, with progress logged
// every 10 s so a long run shows it is moving.
func (b *batchFlags) batch(log *zap.Logger, what string) (maintenance.Batch, error) {
	if b.size < 1 || b.size > maintenance.MaxBatchSize {
		return maintenance.Batch{}, usagef("--batch-size %d: want 1 to %d", b.size, maintenance.MaxBatchSize)
	}
	if b.pause < 0 {
		return maintenance.Batch{}, usagef("--batch-pause %s is negative", b.pause)
	}
	last := time.Now()
	return maintenance.Batch{Size: b.size, Pause: b.pause, Progress: func(n int64) {
		if time.Since(last) >= 10*time.Second {
			last = time.Now()
			log.Info(what+": in progress", zap.Int64("deleted", n))
		}
	}}, nil
}

// refusal turns the maintenance package's refusals into exit code 2.
func refusal(err error) error {
	if maintenance.IsRefused(err) {
		return &usageError{err}
	}
	return err
}

// utcText prints a time for people.
func utcText(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

// parseInterleaved reads positional arguments with flags among them
// (`failed retry ID --dry-run ID`): Go's flag package stops at the first
// argument. It returns the arguments and the names of the flags found
// among them.
func parseInterleaved(fs *flag.FlagSet, args []string) (positional []string, given map[string]bool, err error) {
	given = map[string]bool{}
	for _, a := range args {
		if a == "--" {
			break
		}
		if len(a) > 1 && a[0] == '-' {
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			given[name] = true
		}
	}
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		rest := fs.Args()
		if dd := slices.Index(args, "--"); dd >= 0 && dd < len(args)-len(rest) {
			return append(positional, rest...), given, nil // all after "--" are arguments
		}
		args = rest
		if len(args) == 0 {
			break
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
	return positional, given, nil
}

// maintenanceFlags are run's flags for the maintenance its leader does.
type maintenanceFlags struct {
	interval   time.Duration
	cleanupAge ageValue
	dedupAge   ageValue
	dedupFloor ageValue
	lookahead  int
	retention  ageValue
	lockWait   time.Duration
}

func declareMaintenance(fs *flag.FlagSet) *maintenanceFlags {
	m := &maintenanceFlags{cleanupAge: newAge(7 * 24 * time.Hour), dedupFloor: newAge(maintenance.DefaultDedupFloor),
		retention: newAge(7 * 24 * time.Hour)}
	fs.DurationVar(&m.interval, "maintenance-interval", 0, "run cleanup, dedup-cleanup and partitions on the leader this often (e.g. 1h); 0 turns it off")
	fs.Var(&m.cleanupAge, "cleanup-older-than", "maintenance, --on-delivered=mark: delete rows marked delivered longer ago than this `age`, "+ageHelp)
	fs.Var(&m.dedupAge, "dedup-older-than", "maintenance: delete inbox records processed longer ago than this `age`, "+ageHelp+"; unset: the inbox is left alone")
	declareDedupFloor(fs, &m.dedupFloor)
	declarePartitionFlags(fs, "maintenance, partitioned table: ", &m.lookahead, &m.retention, &m.lockWait)
	return m
}

func declareDedupFloor(fs *flag.FlagSet, floor *ageValue) {
	fs.Var(floor, "dedup-min-age", "the youngest inbox records a dedup cleanup deletes (`age`, "+ageHelp+
		"): keep them longer than any message can be redelivered or replayed")
}

// declarePartitionFlags declares the partition upkeep's flags; prefix
// starts their help ("partitioned table: ", or run's "maintenance, ...").
func declarePartitionFlags(fs *flag.FlagSet, prefix string, lookahead *int, retention *ageValue, lockWait *time.Duration) {
	fs.IntVar(lookahead, "lookahead", 7, prefix+"keep daily partitions this many `days` ahead of today (UTC)")
	fs.Var(retention, "retention", prefix+"drop daily partitions whose rows are all older than this `age`, "+ageHelp+
		", unless they hold undelivered rows; 0 drops none")
	fs.DurationVar(lockWait, "partition-lock-wait", maintenance.DefaultPartitionLockWait,
		prefix+"the longest wait for the table's metadata lock; new queries on the table queue behind it meanwhile")
}

// floorOption is --dedup-min-age for the maintenance package, where 0
// means its default and a negative value no floor.
func floorOption(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// install sets cfg's maintenance hook when --maintenance-interval is set,
// with a database pool of its own on my's connection settings; close
// releases the pool.
func (m *maintenanceFlags) install(cfg *relay.Config, my *mysqlFlags, log *zap.Logger) (closeFn func(), err error) {
	if m.interval < 0 {
		return nil, usagef("--maintenance-interval %s is negative", m.interval)
	}
	if m.interval == 0 {
		return func() {}, nil
	}
	if m.dedupAge.d > 0 && m.dedupAge.d < m.dedupFloor.d {
		return nil, usagef("--dedup-older-than %s is below --dedup-min-age %s: a message redelivered or replayed after its inbox record is gone is processed twice; raise it, or lower --dedup-min-age if you are sure",
			formatAge(m.dedupAge.d), formatAge(m.dedupFloor.d))
	}
	if m.lookahead < 0 {
		return nil, usagef("--lookahead %d is negative", m.lookahead)
	}
	target, err := my.target()
	if err != nil {
		return nil, err
	}
	db, err := target.OpenDB(nil) // connects on first use: the relay reports an unreachable server
	if err != nil {
		return nil, usagef("%v", err)
	}
	db.SetMaxOpenConns(2)
	db.SetConnMaxIdleTime(time.Minute)
	o := maintenance.RoundOptions{Table: cfg.Table, Mark: cfg.OnDelivered == "mark", CleanupAge: m.cleanupAge.d,
		DedupAge: m.dedupAge.d, DedupFloor: floorOption(m.dedupFloor.d), Lookahead: m.lookahead, Retention: m.retention.d,
		LockWait: m.lockWait, Logger: log.Named("maintenance")}
	cfg.MaintenanceInterval = m.interval
	cfg.Maintenance = func(ctx context.Context) { maintenance.Round(ctx, db, o) }
	return func() { db.Close() }, nil
}
