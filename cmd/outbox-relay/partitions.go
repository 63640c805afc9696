package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/maintenance"
)

func init() {
	register(&command{
		name:    "partitions",
		summary: "add and drop the daily partitions of an outbox table made with migrate --partitioned",
		help: `Keeps a partitioned outbox table (migrate --partitioned: one partition per UTC
day of created_at, then pmax) in shape:

  - adds a partition for every day up to --lookahead days after today, split out
    of pmax while pmax is still empty for those days (cheap; a pmax holding
    rows is copied);
  - drops the daily partitions whose rows are all older than --retention (a Go
    duration such as 36h, or whole days such as 7d or 30d; 0 drops none), but
    only those holding no undelivered row (delivered_at IS NULL): such a
    partition is kept and reported. The check and the drop run under
    LOCK TABLES ... WRITE, so no row can slip in between.

Two instances never work on one table at once: each pass holds
GET_LOCK('outbox-relay:partitions:<database>.<table>', 0), and a pass that does
not get it reports that it skipped (exit 0). Each DDL waits at most
--partition-lock-wait for the table's metadata lock (queries on the table queue
behind a waiting DDL): a long transaction makes the pass fail and the next one
try again. The user needs the ALTER, DROP and LOCK TABLES privileges.

With --once it does one pass and exits; without, it does one every --interval
until stopped. With run --maintenance-interval the relay's leader does the same.
--dry-run reports what a pass would do and takes no lock.`,
		setup: setupPartitions,
	})
}

func setupPartitions(fs *flag.FlagSet) runFunc {
	o := declareOps(fs, "partitions")
	once := fs.Bool("once", false, "do one pass and exit")
	interval := fs.Duration("interval", time.Hour, "without --once: the time between passes")
	dryRun := fs.Bool("dry-run", false, "report what one pass would do, change nothing, exit")
	var lookahead int
	retention := newAge(7 * 24 * time.Hour)
	var lockWait time.Duration
	declarePartitionFlags(fs, "", &lookahead, &retention, &lockWait)
	return func(ctx context.Context, inv *invocation) error {
		if err := noArgs(inv, "partitions"); err != nil {
			return err
		}
		if lookahead < 0 {
			return usagef("--lookahead %d is negative", lookahead)
		}
		if *interval <= 0 {
			return usagef("--interval %s: want a positive duration", *interval)
		}
		db, err := o.open(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		opts := maintenance.PartitionOptions{Table: o.table, Lookahead: lookahead, Retention: retention.d, LockWait: lockWait, DryRun: *dryRun}
		for {
			rep, err := maintenance.Partitions(ctx, db, opts)
			switch {
			case err == nil:
				if err := printPartitions(inv.stdout, o.json, o.table, *dryRun, rep); err != nil {
					return err
				}
			case maintenance.IsRefused(err) || *once || *dryRun:
				return refusal(err)
			case ctx.Err() != nil:
				return nil
			default:
				inv.log.Warn("partition pass failed; the next pass tries again", zap.Error(err), zap.Duration("in", *interval))
			}
			if *once || *dryRun {
				return nil
			}
			t := time.NewTimer(*interval)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
	}
}

func printPartitions(w io.Writer, asJSON bool, table string, dryRun bool, rep maintenance.PartitionReport) error {
	if asJSON {
		type kept struct {
			Name        string `json:"name"`
			PendingRows int64  `json:"pending_rows"`
		}
		out := struct {
			Table   string   `json:"table"`
			DryRun  bool     `json:"dry_run"`
			Skipped bool     `json:"skipped"`
			Added   []string `json:"added"`
			Dropped []string `json:"dropped"`
			Kept    []kept   `json:"kept"`
		}{Table: table, DryRun: dryRun, Skipped: rep.Skipped, Added: append([]string{}, rep.Added...),
			Dropped: append([]string{}, rep.Dropped...), Kept: []kept{}}
		for _, k := range rep.Kept {
			out.Kept = append(out.Kept, kept{k.Name, k.Pending})
		}
		return printJSON(w, out)
	}
	if rep.Skipped {
		_, err := fmt.Fprintf(w, "skipped: another process is working on the partitions of %s right now\n", table)
		return err
	}
	add, drop := "added", "dropped"
	if dryRun {
		add, drop = "would add", "would drop"
	}
	if len(rep.Added) > 0 {
		fmt.Fprintf(w, "%s %d partitions: %s\n", add, len(rep.Added), strings.Join(rep.Added, ", "))
	}
	if len(rep.Dropped) > 0 {
		fmt.Fprintf(w, "%s %d partitions: %s\n", drop, len(rep.Dropped), strings.Join(rep.Dropped, ", "))
	}
	for _, k := range rep.Kept {
		fmt.Fprintf(w, "kept %s although past the retention: it holds %d undelivered rows\n", k.Name, k.Pending)
	}
	var err error
	if len(rep.Added)+len(rep.Dropped)+len(rep.Kept) == 0 {
		_, err = fmt.Fprintf(w, "the partitions of %s are up to date\n", table)
	}
	return err
}
