package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/outbox-relay/outbox-relay/maintenance"
)

func init() {
	register(&command{
		name:    "cleanup",
		summary: "delete outbox rows marked delivered (--on-delivered=mark) longer ago than an age",
		help: `With --on-delivered=mark the relay keeps delivered rows, setting delivered_at.
cleanup deletes those marked longer ago than --older-than (a Go duration such as
36h, or whole days such as 7d or 30d). Rows not yet delivered are never touched;
with --on-delivered=delete there is nothing to clean up.

It deletes in batches (--batch-size rows per transaction, each named by primary
key), so a producer inserting meanwhile waits at most for one batch's commit,
never for the whole cleanup. Stopped half way (Ctrl-C, an error), it leaves a
consistent table: run it again to finish. --dry-run counts what would go.
With run --maintenance-interval the leader does this itself.`,
		setup: setupCleanup,
	})
}

func setupCleanup(fs *flag.FlagSet) runFunc {
	o := declareOps(fs, "cleanup")
	var older ageValue
	fs.Var(&older, "older-than", "delete rows marked delivered longer ago than this `age` (required), "+ageHelp)
	dryRun := fs.Bool("dry-run", false, "count the rows that would be deleted and delete nothing")
	batch := declareBatch(fs)
	return func(ctx context.Context, inv *invocation) error {
		if err := noArgs(inv, "cleanup"); err != nil {
			return err
		}
		if !older.set {
			return usagef("cleanup: --older-than is required, e.g. --older-than 7d")
		}
		b, err := batch.batch(inv.log, "cleanup")
		if err != nil {
			return err
		}
		db, err := o.open(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		res, err := maintenance.CleanupDelivered(ctx, db, maintenance.CleanupOptions{Table: o.table, OlderThan: older.d, Batch: b, DryRun: *dryRun})
		if err != nil {
			return refusal(err)
		}
		if o.json {
			return printJSON(inv.stdout, deleteJSON(o.table, *dryRun, res))
		}
		if *dryRun {
			_, err = fmt.Fprintf(inv.stdout, "would delete %d delivered rows of %s (marked delivered before %s)\n", res.Rows, o.table, utcText(res.Cutoff))
			return err
		}
		_, err = fmt.Fprintf(inv.stdout, "deleted %d delivered rows of %s (marked delivered before %s) in %d batches\n",
			res.Rows, o.table, utcText(res.Cutoff), res.Batches)
		return err
	}
}
