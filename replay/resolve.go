package replay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/position"
)

// bounds is a range resolved to positions.
type bounds struct {
	flavor string
	// from: the replay starts with the transaction after it.
	from position.Position
	// to: the replay ends with the transaction that completes it.
	to position.Position
	// limit is the server's position when the replay started: the stream
	// stops there at the latest, whatever to says (a --to-gtid of another
	// server id that the start already passed would never be completed).
	limit position.Position
	// empty: nothing lies between from and to.
	empty bool
	// fromTime: the event time of the first transaction in the range, when
	// the start was a time.
	fromTime time.Time
}

// resolve turns r into positions and checks that the server can stream
// them. Errors the request or the server rules out are *RefusedError.
func resolve(ctx context.Context, db *sql.DB, t *canal.Tailer, flavor string, r Range, log *zap.Logger) (bounds, error) {
	b := bounds{flavor: flavor}
	cur, err := canal.CurrentPosition(ctx, db)
	if err != nil {
		return bounds{}, fmt.Errorf("replay: read the server's position: %w", err)
	}
	b.limit = cur
	if b.from, b.fromTime, err = resolveFrom(ctx, db, t, flavor, r, log); err != nil {
		return bounds{}, err
	}
	if err := canal.CheckPosition(ctx, db, b.from); err != nil {
		var pe *canal.PurgedError
		if !errors.As(err, &pe) {
			return bounds{}, fmt.Errorf("replay: check the start position: %w", err)
		}
		return bounds{}, unknownStart(ctx, db, flavor, b, pe)
	}
	if b.to, err = resolveTo(ctx, db, t, flavor, r, cur, b.from, log); err != nil {
		return bounds{}, err
	}
	// A position the start already contains ends the range before it
	// begins: a time range without transactions, or a start at the end.
	for _, end := range []position.Position{b.to, b.limit} {
		if ok, err := reached(b.from, end); err != nil {
			return bounds{}, err
		} else if ok {
			b.empty = true
		}
	}
	return b, nil
}

// resolveFrom is the start of r: its GTID set, or the position of the
// first transaction at or after its time, with that transaction's time
// (zero when there is none). A time before the oldest binlog, when older
// transactions existed, is refused: they may have been purged.
func resolveFrom(ctx context.Context, db *sql.DB, t *canal.Tailer, flavor string, r Range, log *zap.Logger) (position.Position, time.Time, error) {
	if r.FromGTID != "" {
		if _, err := position.NewGTIDs(flavor, r.FromGTID); err != nil {
			return position.Position{}, time.Time{}, refused("replay: Range.FromGTID: %v", err)
		}
		return position.Position{Flavor: flavor, GTIDSet: r.FromGTID}, time.Time{}, nil
	}
	tp, err := t.TimePosition(ctx, db, r.FromTime)
	if err != nil {
		return position.Position{}, time.Time{}, fmt.Errorf("replay: find Range.FromTime %s in the binlog: %w", r.FromTime.Format(time.RFC3339), err)
	}
	log.Info("Range.FromTime resolved", zap.Time("time", r.FromTime), zap.Bool("found", tp.Found),
		zap.String("file", tp.File), zap.Uint32("pos", tp.Pos), zap.Stringer("position", tp.Position),
		zap.Int("files_probed", tp.FilesProbed))
	if tp.BeforeOldest {
		oldest, err := oldestPosition(ctx, db, flavor, tp.Oldest)
		if err != nil {
			return position.Position{}, time.Time{}, err
		}
		if !oldest.IsZero() { // transactions before the oldest binlog existed: purged
			return position.Position{}, time.Time{}, refused("replay: Range.FromTime %s is before the oldest binlog the server has (%s, begun %s), "+
				"so transactions of that time may have been purged; the oldest position available is %s: "+
				"start there with Range.FromTime %s (or later)%s",
				r.FromTime.UTC().Format(time.RFC3339), tp.Oldest, tp.OldestStart.Format(time.RFC3339),
				describe(oldest), tp.OldestStart.Format(time.RFC3339), orGTID(oldest))
		}
	}
	if !tp.Found {
		return tp.Position, time.Time{}, nil
	}
	return tp.Position, tp.Time, nil
}

// resolveTo is the end of r: its GTID set, which the server must have and
// from must not contain; the position of the first transaction after its
// time's second; or, with neither or a time after the last transaction,
// the server's position cur.
func resolveTo(ctx context.Context, db *sql.DB, t *canal.Tailer, flavor string, r Range, cur, from position.Position, log *zap.Logger) (position.Position, error) {
	switch {
	case r.ToGTID != "":
		if _, err := position.NewGTIDs(flavor, r.ToGTID); err != nil {
			return position.Position{}, refused("replay: Range.ToGTID: %v", err)
		}
		to := position.Position{Flavor: flavor, GTIDSet: r.ToGTID}
		state, err := serverState(ctx, db, flavor, cur)
		if err != nil {
			return position.Position{}, err
		}
		if ok, err := reached(state, to); err != nil {
			return position.Position{}, err
		} else if !ok {
			return position.Position{}, refused("replay: Range.ToGTID %s is not in the server's binlog yet (the server is at %s)", r.ToGTID, describe(cur))
		}
		if ok, err := reached(from, to); err != nil {
			return position.Position{}, err
		} else if ok {
			return position.Position{}, refused("replay: Range.ToGTID %s is at or before the start %s: the range is empty", r.ToGTID, describe(from))
		}
		return to, nil
	case !r.ToTime.IsZero():
		// Events of ToTime's second are in the range: the end is the
		// first transaction of a later second.
		after := r.ToTime.Truncate(time.Second).Add(time.Second)
		tp, err := t.TimePosition(ctx, db, after)
		if err != nil {
			return position.Position{}, fmt.Errorf("replay: find Range.ToTime %s in the binlog: %w", r.ToTime.Format(time.RFC3339), err)
		}
		log.Info("Range.ToTime resolved", zap.Time("time", r.ToTime), zap.Bool("found", tp.Found),
			zap.String("file", tp.File), zap.Uint32("pos", tp.Pos), zap.Stringer("position", tp.Position))
		if !tp.Found {
			return cur, nil
		}
		return tp.Position, nil
	}
	return cur, nil
}

// reached reports whether a stream at pos has passed every transaction of
// until: GTID containment (MariaDB per domain and server id, like the
// tailer's duplicate guard), or file order for file positions.
func reached(pos, until position.Position) (bool, error) {
	if until.GTIDSet == "" || pos.GTIDSet == "" && pos.File != "" {
		ok, err := position.Reached(pos, until)
		if err != nil {
			return false, fmt.Errorf("replay: compare %s with %s: %w", pos, until, err)
		}
		return ok, nil
	}
	g, err := position.NewGTIDs(pos.Flavor, pos.GTIDSet)
	if err != nil {
		return false, fmt.Errorf("replay: position %s: %w", pos, err)
	}
	ok, err := g.Covers(until)
	if err != nil {
		return false, fmt.Errorf("replay: compare %s with %s: %w", pos, until, err)
	}
	return ok, nil
}

// serverState is every transaction the server's binlog holds or held, as a
// position whose GTIDs cover them: @@gtid_binlog_state on MariaDB (every
// server id of every domain), the current position otherwise.
func serverState(ctx context.Context, db *sql.DB, flavor string, cur position.Position) (position.Position, error) {
	if flavor != canal.FlavorMariaDB {
		return cur, nil
	}
	state, err := canal.ExecutedGTIDs(ctx, db, flavor)
	if err != nil {
		return position.Position{}, fmt.Errorf("replay: %w", err)
	}
	return position.Position{Flavor: flavor, GTIDSet: state}, nil
}

// oldestPosition is the oldest position a replay can start from: the GTID
// state at the start of the oldest binlog (MariaDB), @@gtid_purged (MySQL
// with GTIDs), or the start of the oldest file. file names the oldest binlog
// when the caller knows it.
func oldestPosition(ctx context.Context, db *sql.DB, flavor, file string) (position.Position, error) {
	if file == "" {
		files, err := canal.BinaryLogs(ctx, db)
		if err != nil {
			return position.Position{}, fmt.Errorf("replay: %w", err)
		}
		file = files[0].Name
	}
	p := position.Position{Flavor: flavor}
	if flavor == canal.FlavorMariaDB {
		var set sql.NullString
		if err := db.QueryRowContext(ctx, "SELECT BINLOG_GTID_POS(?, 4)", file).Scan(&set); err != nil {
			return position.Position{}, fmt.Errorf("replay: read the GTID position at the start of %s: %w", file, err)
		}
		p.GTIDSet = set.String
		return p, nil
	}
	var mode string
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_mode").Scan(&mode); err == nil && (mode == "ON" || mode == "on") {
		var purged string
		if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_purged").Scan(&purged); err != nil {
			return position.Position{}, fmt.Errorf("replay: read @@gtid_purged: %w", err)
		}
		p.GTIDSet = purged
		return p, nil
	}
	p.File, p.Pos = file, 4
	return p, nil
}

// describe is a position as an operator types it back: the GTID set alone,
// a file and offset, or "the start of the binlog".
func describe(p position.Position) string {
	switch {
	case p.GTIDSet != "":
		return p.GTIDSet
	case p.File != "":
		return fmt.Sprintf("%s:%d", p.File, p.Pos)
	default:
		return "the start of the binlog (empty GTID set)"
	}
}

// orGTID suggests Range.FromGTID for a GTID position.
func orGTID(p position.Position) string {
	if p.GTIDSet == "" {
		return ""
	}
	return " (Range.FromGTID " + p.GTIDSet + ")"
}
