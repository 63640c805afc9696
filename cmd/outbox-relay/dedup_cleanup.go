package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/outbox-relay/outbox-relay/maintenance"
)

func init() {
	register(&command{
		name:    "dedup-cleanup",
		summary: "delete inbox records (message_deduplication) older than an age",
		help: `Deletes the records of processed messages (message_deduplication, written by
the dedup package) processed longer ago than --older-than (a Go duration such as
36h, or whole days such as 7d or 30d), of one --consumer or of all.

An inbox record is what makes a consumer skip a message it already processed.
Once it is gone, the same message arriving again (a broker redelivery, a relay
repeating its unacknowledged tail after a crash, a replay, failed retry) is
processed a second time. So an age below --dedup-min-age (default 7d) is
refused (exit 2) unless --force is given: keep records longer than any message
can come back.

Deletes go in batches like cleanup's (--batch-size per transaction), so the
consumers' own inserts wait at most for one batch. --dry-run counts what would
go.`,
		setup: setupDedupCleanup,
	})
}

func setupDedupCleanup(fs *flag.FlagSet) runFunc {
	o := declareOps(fs, "dedup-cleanup")
	var older ageValue
	fs.Var(&older, "older-than", "delete records processed longer ago than this `age` (required), "+ageHelp)
	var consumer *string
	fs.Func("consumer", "only this `consumer`'s records (the name given to dedup.New); default: every consumer's", func(s string) error {
		consumer = &s
		return nil
	})
	floor := newAge(maintenance.DefaultDedupFloor)
	declareDedupFloor(fs, &floor)
	force := new(bool)
	declareOverride(fs, force, "force", "delete even when --older-than is below --dedup-min-age")
	dryRun := fs.Bool("dry-run", false, "count the records that would be deleted and delete nothing")
	batch := declareBatch(fs)
	return func(ctx context.Context, inv *invocation) error {
		if err := noArgs(inv, "dedup-cleanup"); err != nil {
			return err
		}
		if !older.set {
			return usagef("dedup-cleanup: --older-than is required, e.g. --older-than 30d")
		}
		if older.d < floor.d && !*force {
			return usagef("dedup-cleanup: --older-than %s is below --dedup-min-age %s: a message redelivered or replayed after its inbox record is gone is processed twice; choose an older age, or add --force if no message can come back that late",
				formatAge(older.d), formatAge(floor.d))
		}
		b, err := batch.batch(inv.log, "dedup-cleanup")
		if err != nil {
			return err
		}
		db, err := o.open(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		res, err := maintenance.DedupCleanup(ctx, db, maintenance.DedupCleanupOptions{OlderThan: older.d, Consumer: consumer,
			Floor: floorOption(floor.d), Force: *force, Batch: b, DryRun: *dryRun})
		if err != nil {
			return refusal(err)
		}
		if o.json {
			return printJSON(inv.stdout, deleteJSON(maintenance.DedupTable, *dryRun, res))
		}
		whose := "of every consumer"
		if consumer != nil {
			whose = fmt.Sprintf("of consumer %q", *consumer)
		}
		verb := "deleted"
		if *dryRun {
			verb = "would delete"
		}
		_, err = fmt.Fprintf(inv.stdout, "%s %d inbox records %s (processed before %s)\n", verb, res.Rows, whose, utcText(res.Cutoff))
		return err
	}
}
