package maintenance

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// PartitionOptions says what Partitions keeps and drops.
type PartitionOptions struct {
	// Table is the outbox table, made with `migrate --partitioned`; ""
	// means outbox.DefaultTable.
	Table string
	// Lookahead is how many days after today (UTC) get their own daily
	// partition ahead of time, split out of the MAXVALUE partition (pmax)
	// while it is still empty for them. 0: today's only.
	Lookahead int
	// Retention: a daily partition whose every row is older than this
	// (created_at) is dropped, unless it holds a pending row
	// (delivered_at IS NULL: not yet delivered, or failed in delete mode's
	// absence). 0 drops nothing.
	Retention time.Duration
	// LockWait bounds each wait for the table's metadata lock (the DDL's
	// lock_wait_timeout); 0 means DefaultPartitionLockWait. While a DDL
	// waits, new transactions on the table queue behind it, so keep it
	// short: a run that times out changes nothing and the next one tries
	// again.
	LockWait time.Duration
	// DryRun reports what would change; it takes no lock and changes
	// nothing.
	DryRun bool
}

// DefaultPartitionLockWait is PartitionOptions.LockWait's default.
const DefaultPartitionLockWait = 2 * time.Second

// PartitionReport is what Partitions did, or in a dry run would do.
type PartitionReport struct {
	// Skipped: another process held the partitions lock of this table, so
	// this run did nothing.
	Skipped bool
	Added   []string // partitions created
	Dropped []string // partitions dropped
	Kept    []Kept   // partitions past the retention that hold pending rows
}

// Kept is a partition past the retention that was not dropped.
type Kept struct {
	Name    string
	Pending int64 // rows with delivered_at IS NULL
}

// partition is one partition of the table as information_schema shows it.
type partition struct {
	name  string
	bound time.Time // VALUES LESS THAN; zero for MAXVALUE
}

// Partitions keeps the daily partitions of a partitioned outbox table: it
// adds those missing up to Lookahead days after today (REORGANIZE PARTITION
// of the MAXVALUE partition, or ADD PARTITION if there is none) and drops
// those past Retention that hold no pending row. The pending check and the
// drop run under LOCK TABLES ... WRITE, so no row can arrive in between.
//
// Concurrent runs on one table never overlap: each holds
// GET_LOCK('outbox-relay:partitions:<database>.<table>', 0) on its own
// connection, and a run that does not get it returns at once with Skipped.
// A table not partitioned by RANGE COLUMNS(created_at) is a *RefusedError.
func Partitions(ctx context.Context, db *sql.DB, o PartitionOptions) (rep PartitionReport, err error) {
	table, err := quoteOutbox(o.Table)
	if err != nil {
		return rep, err
	}
	name := strings.Trim(table, "`")
	if o.Lookahead < 0 || o.Retention < 0 {
		return rep, refused("lookahead %d and retention %s must not be negative", o.Lookahead, o.Retention)
	}
	wait := o.LockWait
	if wait <= 0 {
		wait = DefaultPartitionLockWait
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return rep, fmt.Errorf("partitions of %s: connect: %w", name, err)
	}
	defer conn.Close()
	// The session's lock_wait_timeout, and any lock a failure left, must not
	// go back to the pool with the connection.
	defer func() { _ = conn.Raw(func(any) error { return driver.ErrBadConn }) }()
	var schema sql.NullString
	if err := conn.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&schema); err != nil || !schema.Valid {
		return rep, fmt.Errorf("partitions of %s: read the current database (is one named in the DSN?): %v", name, err)
	}
	if !o.DryRun {
		release, got, err := takePartitionsLock(ctx, conn, schema.String, name, wait)
		if err != nil || !got {
			return PartitionReport{Skipped: err == nil}, err
		}
		defer release()
	}
	plan, err := planPartitions(ctx, conn, schema.String, name, o.Lookahead, o.Retention)
	if err != nil {
		return rep, err
	}
	if o.DryRun {
		return plan.preview(ctx, conn, table)
	}
	return plan.apply(ctx, conn, table, wait)
}

// takePartitionsLock takes the partitions lock of schema.table on conn
// without waiting (got is false when another session holds it) and sets the
// session's lock_wait_timeout to wait. release gives the lock back.
func takePartitionsLock(ctx context.Context, conn *sql.Conn, schema, table string, wait time.Duration) (release func(), got bool, err error) {
	lock := PartitionsLockName(schema, table)
	var n sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", lock).Scan(&n); err != nil {
		return nil, false, fmt.Errorf("partitions of %s: take lock %q: %w", table, lock, err)
	}
	if n.Int64 != 1 {
		return nil, false, nil
	}
	release = func() { releaseLock(ctx, conn, lock) }
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d", max(1, int(wait.Round(time.Second)/time.Second)))); err != nil {
		release()
		return nil, false, fmt.Errorf("partitions of %s: set lock_wait_timeout: %w", table, err)
	}
	return release, true, nil
}

// partitionPlan is what a run of Partitions does, decided from the table's
// partitions and the server's time without changing anything: the dry run
// reports it (preview), the real run carries it out (apply).
type partitionPlan struct {
	name    string      // the table, unquoted, for messages
	adds    []partition // daily partitions to create, in order
	maxName string      // the MAXVALUE partition they are split from; "": ADD PARTITION
	old     []partition // past the retention: dropped unless they hold a pending row
}

// planPartitions reads the table's partitions and the server's time and
// plans the run.
func planPartitions(ctx context.Context, conn *sql.Conn, schema, name string, lookahead int, retention time.Duration) (partitionPlan, error) {
	parts, err := readPartitions(ctx, conn, schema, name)
	if err != nil {
		return partitionPlan{}, err
	}
	var nowText string
	if err := conn.QueryRowContext(ctx, "SELECT DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%d %H:%i:%s.%f')").Scan(&nowText); err != nil {
		return partitionPlan{}, fmt.Errorf("partitions of %s: read the server's time: %w", name, err)
	}
	now, err := time.ParseInLocation(datetimeLayout, nowText, time.UTC)
	if err != nil {
		return partitionPlan{}, fmt.Errorf("partitions of %s: read the server's time %q: %w", name, nowText, err)
	}
	p := decidePartitions(parts, now, lookahead, retention)
	p.name = name
	return p, nil
}

// decidePartitions plans a run on parts at now: the daily partitions to add
// up to lookahead days after today, and the bounded partitions whose every
// row is older than retention (none when retention is 0).
func decidePartitions(parts []partition, now time.Time, lookahead int, retention time.Duration) partitionPlan {
	var p partitionPlan
	p.adds, p.maxName = plannedAdds(parts, now, lookahead)
	if retention == 0 {
		return p
	}
	cutoff := now.Add(-retention)
	for _, part := range parts {
		if !part.bound.IsZero() && !part.bound.After(cutoff) {
			p.old = append(p.old, part)
		}
	}
	return p
}

// added is the names of the partitions p adds.
func (p partitionPlan) added() []string {
	var out []string
	for _, a := range p.adds {
		out = append(out, a.name)
	}
	return out
}

// preview reports what apply would do, without a lock: the old partitions'
// pending rows are counted as they are now.
func (p partitionPlan) preview(ctx context.Context, conn *sql.Conn, table string) (PartitionReport, error) {
	rep := PartitionReport{Added: p.added()}
	if len(p.old) == 0 {
		return rep, nil
	}
	pending, err := countPending(ctx, conn, table, p.old)
	if err != nil {
		return rep, fmt.Errorf("partitions of %s: %w", p.name, err)
	}
	rep.Dropped, rep.Kept = splitPending(p.old, pending)
	return rep, nil
}

// apply carries the plan out: the partitions added, then, under LOCK
// TABLES ... WRITE, the old partitions' pending rows counted and those
// without any dropped.
func (p partitionPlan) apply(ctx context.Context, conn *sql.Conn, table string, wait time.Duration) (rep PartitionReport, err error) {
	if len(p.adds) > 0 {
		if _, err := conn.ExecContext(ctx, addStatement(table, p.adds, p.maxName)); err != nil {
			return rep, fmt.Errorf("partitions of %s: add %s: %w", p.name, p.adds[0].name, lockHint(err, wait))
		}
		rep.Added = p.added()
	}
	if len(p.old) == 0 {
		return rep, nil
	}
	// LOCK TABLES: no row can land in an old partition between the check
	// and the drop (a producer that writes created_at itself could put one
	// there).
	if _, err := conn.ExecContext(ctx, "LOCK TABLES "+table+" WRITE"); err != nil {
		return rep, fmt.Errorf("partitions of %s: lock the table to drop old partitions: %w", p.name, lockHint(err, wait))
	}
	defer func() {
		if _, uerr := conn.ExecContext(context.WithoutCancel(ctx), "UNLOCK TABLES"); uerr != nil && err == nil {
			err = fmt.Errorf("partitions of %s: unlock tables: %w", p.name, uerr)
		}
	}()
	pending, err := countPending(ctx, conn, table, p.old)
	if err != nil {
		return rep, fmt.Errorf("partitions of %s: %w", p.name, err)
	}
	drop, kept := splitPending(p.old, pending)
	rep.Kept = kept
	if len(drop) == 0 {
		return rep, nil
	}
	if _, err := conn.ExecContext(ctx, "ALTER TABLE "+table+" DROP PARTITION "+strings.Join(drop, ", ")); err != nil {
		return rep, fmt.Errorf("partitions of %s: drop %s: %w", p.name, strings.Join(drop, ", "), lockHint(err, wait))
	}
	rep.Dropped = drop
	return rep, nil
}

// IsPartitioned reports whether table (in the pool's current database) is
// range-partitioned, as `migrate --partitioned` makes it.
func IsPartitioned(ctx context.Context, db *sql.DB, table string) (bool, error) {
	q, err := quoteOutbox(table)
	if err != nil {
		return false, err
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PARTITIONS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND PARTITION_NAME IS NOT NULL`, strings.Trim(q, "`")).Scan(&n); err != nil {
		return false, fmt.Errorf("read the partitions of %s: %w", q, err)
	}
	return n > 0, nil
}

// readPartitions returns the table's partitions in order; a table that is
// not range-partitioned by created_at is a *RefusedError.
func readPartitions(ctx context.Context, conn *sql.Conn, schema, table string) ([]partition, error) {
	rows, err := conn.QueryContext(ctx, `SELECT PARTITION_NAME, PARTITION_METHOD, PARTITION_EXPRESSION, PARTITION_DESCRIPTION
		FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY PARTITION_ORDINAL_POSITION`, schema, table)
	if err != nil {
		return nil, fmt.Errorf("read the partitions of %s: %w", table, err)
	}
	defer rows.Close()
	var parts []partition
	found := false
	for rows.Next() {
		found = true
		var name, method, expr, desc sql.NullString
		if err := rows.Scan(&name, &method, &expr, &desc); err != nil {
			return nil, fmt.Errorf("read the partitions of %s: %w", table, err)
		}
		if !name.Valid {
			return nil, refused("table %s is not partitioned; partitions works on tables made with migrate --partitioned", table)
		}
		if method.String != "RANGE COLUMNS" || strings.Trim(expr.String, "`") != "created_at" {
			return nil, refused("table %s is partitioned by %s(%s), not RANGE COLUMNS(created_at) as migrate --partitioned makes it",
				table, method.String, expr.String)
		}
		p := partition{name: name.String}
		if d := strings.Trim(desc.String, "'"); d != "MAXVALUE" {
			if p.bound, err = parseBound(d); err != nil {
				return nil, fmt.Errorf("partition %s of %s: bound %q: %w", p.name, table, desc.String, err)
			}
		}
		parts = append(parts, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the partitions of %s: %w", table, err)
	}
	if !found {
		return nil, fmt.Errorf("table %s does not exist in database %s; create it with migrate --partitioned", table, schema)
	}
	return parts, nil
}

// parseBound reads a partition's VALUES LESS THAN datetime, as written
// (with or without the time of day).
func parseBound(s string) (time.Time, error) {
	if len(s) == len("2006-01-02") {
		return time.ParseInLocation("2006-01-02", s, time.UTC)
	}
	return time.ParseInLocation("2006-01-02 15:04:05.999999", s, time.UTC)
}

// plannedAdds returns the daily partitions to add so that every day up to
// today+lookahead has one, and the name of the MAXVALUE partition to split
// them from ("" if there is none).
func plannedAdds(parts []partition, now time.Time, lookahead int) (adds []partition, maxName string) {
	names := map[string]bool{}
	var last time.Time
	for _, p := range parts {
		names[p.name] = true
		if p.bound.IsZero() {
			maxName = p.name
		} else if p.bound.After(last) {
			last = p.bound
		}
	}
	today := now.UTC().Truncate(24 * time.Hour)
	target := today.AddDate(0, 0, lookahead+1) // the bound of the last day wanted
	from := last
	if from.IsZero() {
		from = today
	}
	for from.Before(target) {
		day := from.Truncate(24 * time.Hour)
		next := day.AddDate(0, 0, 1)
		name := "p" + day.Format("20060102")
		for suffix := 'b'; names[name]; suffix++ {
			name = "p" + day.Format("20060102") + string(suffix)
		}
		names[name] = true
		adds = append(adds, partition{name: name, bound: next})
		from = next
	}
	return adds, maxName
}

func addStatement(table string, adds []partition, maxName string) string {
	defs := make([]string, len(adds))
	for i, a := range adds {
		defs[i] = "PARTITION " + a.name + " VALUES LESS THAN ('" + a.bound.Format("2006-01-02 15:04:05") + "')"
	}
	if maxName == "" {
		return "ALTER TABLE " + table + " ADD PARTITION (" + strings.Join(defs, ", ") + ")"
	}
	return "ALTER TABLE " + table + " REORGANIZE PARTITION " + maxName + " INTO (" + strings.Join(defs, ", ") +
		", PARTITION " + maxName + " VALUES LESS THAN (MAXVALUE))"
}

// countPending counts the pending rows (delivered_at IS NULL) of each old
// partition, by name.
func countPending(ctx context.Context, conn *sql.Conn, table string, old []partition) (map[string]int64, error) {
	pending := map[string]int64{}
	for _, p := range old {
		var n int64
		if err := conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table+" PARTITION ("+p.name+") WHERE delivered_at IS NULL").Scan(&n); err != nil {
			return nil, fmt.Errorf("count pending rows in partition %s: %w", p.name, err)
		}
		pending[p.name] = n
	}
	return pending, nil
}

// splitPending splits old partitions into those without pending rows (to
// drop) and those with (kept), in order.
func splitPending(old []partition, pending map[string]int64) (drop []string, kept []Kept) {
	for _, p := range old {
		if n := pending[p.name]; n > 0 {
			kept = append(kept, Kept{Name: p.name, Pending: n})
		} else {
			drop = append(drop, p.name)
		}
	}
	return drop, kept
}

// PartitionsLockName is the GET_LOCK name Partitions holds while it works
// on database.table. Lock names are server-wide, so the database is part of
// it; MySQL limits names to 64 characters, so a longer one is shortened to a
// hash.
func PartitionsLockName(schema, table string) string {
	const prefix = "outbox-relay:partitions:"
	name := prefix + schema + "." + table
	if len(name) <= 64 {
		return name
	}
	sum := sha256.Sum256([]byte(schema + "." + table))
	return prefix + hex.EncodeToString(sum[:])[:64-len(prefix)]
}

// releaseLock releases the lock even when ctx is done; if that fails the
// connection is discarded, which ends the session and with it the lock.
func releaseLock(ctx context.Context, conn *sql.Conn, lock string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "DO RELEASE_LOCK(?)", lock); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}

// lockHint says what a metadata lock timeout means.
func lockHint(err error, wait time.Duration) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1205 {
		return fmt.Errorf("%w: another transaction held the table for longer than %s (a long transaction on it?); nothing was changed, try again later", err, wait)
	}
	return err
}
