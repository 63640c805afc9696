package maintenance

import (
	"context"
	"database/sql"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// RoundOptions says what a maintenance Round does.
type RoundOptions struct {
	// Table is the outbox table; "" means outbox.DefaultTable.
	Table string
	// Mark: delivered rows are marked (on-delivered mark), so CleanupAge
	// applies; with delete mode there is nothing to clean up.
	Mark bool
	// CleanupAge: rows marked delivered longer ago are deleted (mark mode
	// only); 0 deletes none.
	CleanupAge time.Duration
	// DedupAge: inbox records processed longer ago are deleted; 0 leaves
	// the inbox alone. DedupFloor is DedupCleanupOptions.Floor.
	DedupAge, DedupFloor time.Duration
	// Lookahead, Retention and LockWait are PartitionOptions' for a
	// partitioned table; an unpartitioned one is left alone.
	Lookahead int
	Retention time.Duration
	LockWait  time.Duration
	// Logger receives what each round did and its failures; nil logs
	// nothing.
	Logger *zap.Logger
}

// Round is one round of the upkeep a relay's leader does while it leads
// (relay.Config.Maintenance): the cleanup of delivered rows, of old inbox
// records, and the partitions of a partitioned outbox table. A job that
// fails is logged at WARN and the round goes on; the next round tries
// again. It returns when the jobs are done or ctx ends.
func Round(ctx context.Context, db *sql.DB, o RoundOptions) {
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	table := o.Table
	if table == "" {
		table = outbox.DefaultTable
	}
	failed := func(what string, err error) {
		if ctx.Err() == nil {
			log.Warn(what+" failed; the next maintenance round tries again", zap.Error(err))
		}
	}
	if o.Mark && o.CleanupAge > 0 {
		res, err := CleanupDelivered(ctx, db, CleanupOptions{Table: table, OlderThan: o.CleanupAge})
		if err != nil {
			failed("cleanup of delivered rows", err)
		} else if res.Rows > 0 {
			log.Info("deleted delivered rows", zap.String("table", table), zap.Int64("rows", res.Rows),
				zap.Time("delivered_before", res.Cutoff))
		}
	}
	if o.DedupAge > 0 {
		res, err := DedupCleanup(ctx, db, DedupCleanupOptions{OlderThan: o.DedupAge, Floor: o.DedupFloor})
		if err != nil {
			failed("cleanup of inbox records", err)
		} else if res.Rows > 0 {
			log.Info("deleted inbox records", zap.Int64("rows", res.Rows), zap.Time("processed_before", res.Cutoff))
		}
	}
	partitioned, err := IsPartitioned(ctx, db, table)
	if err != nil {
		failed("partition upkeep", err)
		return
	}
	if !partitioned {
		return
	}
	rep, err := Partitions(ctx, db, PartitionOptions{Table: table, Lookahead: o.Lookahead, Retention: o.Retention, LockWait: o.LockWait})
	switch {
	case err != nil:
		failed("partition upkeep", err)
	case rep.Skipped:
		log.Info("partition upkeep skipped: another process is at it", zap.String("table", table))
	default:
		for _, k := range rep.Kept {
			log.Warn("partition past the retention kept: it holds undelivered rows", zap.String("table", table),
				zap.String("partition", k.Name), zap.Int64("pending_rows", k.Pending))
		}
		if len(rep.Added)+len(rep.Dropped) > 0 {
			log.Info("partitions kept up", zap.String("table", table), zap.Strings("added", rep.Added), zap.Strings("dropped", rep.Dropped))
		}
	}
}
