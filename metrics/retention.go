package metrics

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/canal"
)

// ErrBinlogPurged: the binlog file holding the stored position is no longer
// on the server (its name sorts before the oldest one listed). The headroom is
// 0; resuming from the position will fail.
var ErrBinlogPurged = errors.New("the binlog file holding the stored position was purged")

// ErrHeadroomUnknown: the headroom cannot be bounded (see RetentionHeadroom);
// the value returned with it is NaN.
var ErrHeadroomUnknown = errors.New("binlog retention headroom unknown")

// BinlogRetention is what the server tells about its binlog expiry: enough to
// compute the retention headroom of any of its binlog files.
type BinlogRetention struct {
	// Expiry is the age after which a binlog file is purged automatically:
	// binlog_expire_logs_seconds (MySQL 8, MariaDB 10.6+) when non-zero, else
	// expire_logs_days × 86400. 0 means binlogs never expire (also when
	// MySQL's binlog_expire_logs_auto_purge is OFF).
	Expiry time.Duration
	// Files are the names SHOW BINARY LOGS lists, oldest first; the last one
	// is the file being written.
	Files []string
	// Now is the server's clock (@@timestamp) when this was read. File
	// times and event timestamps come from that clock too, so the relay's own
	// clock plays no part.
	Now time.Time
}

// ReadBinlogRetention reads the binlog expiry settings, the binlog files and
// the server's clock. It needs REPLICATION CLIENT (MariaDB: BINLOG MONITOR)
// for SHOW BINARY LOGS, and fails when the server has no binlog.
func ReadBinlogRetention(ctx context.Context, db *sql.DB) (BinlogRetention, error) {
	var r BinlogRetention
	vars, err := globalVariables(ctx, db,
		"binlog_expire_logs_seconds", "expire_logs_days", "binlog_expire_logs_auto_purge")
	if err != nil {
		return r, err
	}
	if r.Expiry, err = expiryOf(vars); err != nil {
		return r, err
	}
	logs, err := canal.BinaryLogs(ctx, db)
	if err != nil {
		return r, fmt.Errorf("%w (needs REPLICATION CLIENT, MariaDB: BINLOG MONITOR)", err)
	}
	for _, f := range logs {
		r.Files = append(r.Files, f.Name)
	}
	var ts float64
	if err := db.QueryRowContext(ctx, "SELECT @@timestamp").Scan(&ts); err != nil {
		return r, fmt.Errorf("read the server clock (@@timestamp): %w", err)
	}
	sec, frac := math.Modf(ts)
	r.Now = time.Unix(int64(sec), int64(frac*1e9)).UTC()
	return r, nil
}

// globalVariables returns the named global variables the server has; ones it
// does not know (e.g. expire_logs_days on MySQL 8.4) are absent from the map.
// names must be plain identifiers (letters, digits, _).
func globalVariables(ctx context.Context, db *sql.DB, names ...string) (map[string]string, error) {
	// Literal names, not placeholders: SHOW cannot be prepared everywhere.
	// They are the constant identifiers above, never input.
	q := "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('" + strings.Join(names, "', '") + "')"
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("read binlog expiry settings: %w", err)
	}
	defer rows.Close()
	vars := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, fmt.Errorf("read binlog expiry settings: %w", err)
		}
		vars[strings.ToLower(k)] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read binlog expiry settings: %w", err)
	}
	return vars, nil
}

// expiryOf applies the servers' rules to the variables: a non-zero
// binlog_expire_logs_seconds wins, else expire_logs_days (fractional on
// MariaDB); auto purge OFF (MySQL 8.0.29+) or both zero means no expiry.
func expiryOf(vars map[string]string) (time.Duration, error) {
	if v, ok := vars["binlog_expire_logs_auto_purge"]; ok && (strings.EqualFold(v, "OFF") || v == "0") {
		return 0, nil
	}
	if v, ok := vars["binlog_expire_logs_seconds"]; ok && v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("binlog_expire_logs_seconds %q: %w", v, err)
		}
		if s > 0 {
			return time.Duration(min(s, uint64(math.MaxInt64/int64(time.Second)))) * time.Second, nil
		}
	}
	if v, ok := vars["expire_logs_days"]; ok && v != "" {
		d, err := strconv.ParseFloat(v, 64)
		if err != nil || d < 0 || math.IsNaN(d) || math.IsInf(d, 0) {
			return 0, fmt.Errorf("expire_logs_days %q: not a number of days", v)
		}
		if d > 0 {
			return time.Duration(d * 86400 * float64(time.Second)).Round(time.Second), nil
		}
	}
	return 0, nil
}

// RetentionHeadroom returns a lower bound, in seconds, on how long the binlog
// file storedFile (the binlog_file of the stored position, a name on this
// server) is certain to survive the server's automatic expiry. It is
// ReadBinlogRetention followed by BinlogRetention.Headroom; see Headroom
// for the figure and the meaning of writtenAt.
func RetentionHeadroom(ctx context.Context, db *sql.DB, storedFile string, writtenAt time.Time) (float64, error) {
	r, err := ReadBinlogRetention(ctx, db)
	if err != nil {
		return math.NaN(), fmt.Errorf("binlog retention headroom of %s: %w", storedFile, err)
	}
	return r.Headroom(storedFile, writtenAt)
}

// Headroom returns a lower bound, in seconds, on how long storedFile is
// certain to survive the server's automatic expiry.
//
// How servers expire binlogs (MySQL 8 and MariaDB alike): at startup, at
// every rotation (max_binlog_size reached, FLUSH BINARY LOGS) and nowhere
// else, they delete, oldest first, the files whose last-modified time
// (stat mtime, server clock) is older than now − Expiry, never the file being
// written. A closed file's mtime is the moment it was rotated. So storedFile
// may be purged from mtime + Expiry on, and no SQL statement exposes a file's
// mtime or any event time (SHOW BINARY LOGS has names and sizes, SHOW BINLOG
// EVENTS positions and no times, information_schema nothing).
//
// The figure is therefore computed from what is certain:
//
//   - Expiry 0 (binlogs never expire): +Inf, for any file still listed.
//   - storedFile is the file being written (the last one listed): Expiry. It
//     cannot be purged before it is rotated, and then not for Expiry more.
//     This is the usual case for a relay that keeps up: its position moves
//     with the binlog, also when idle.
//   - storedFile is an older file: writtenAt + Expiry − Now, clamped to
//     [0, Expiry]. writtenAt must be a time at which the server was still
//     writing storedFile or a later one (any such time is ≤ its mtime, so
//     the result never overstates): best, the header timestamp of the binlog
//     event at the stored position, which lies in storedFile; next best, the
//     rotation time (timestamp of the ROTATE event ending storedFile), which
//     is exact; acceptable, outbox_relay_progress.last_event_at (created_at
//     by the server's clock, before the commit was written), which can be far
//     too low after a quiet period and then understates. A zero writtenAt
//     gives NaN and ErrHeadroomUnknown.
//   - storedFile sorts before the oldest file listed: 0 and ErrBinlogPurged.
//   - storedFile is not a name of this server's binlogs (other base name, or
//     after the newest: a position from another server, e.g. before a
//     failover, or "" when none is stored): NaN and ErrHeadroomUnknown.
//
// The real purge comes later than the figure says, never earlier: only at the
// next rotation after the deadline, and later still while a connected replica
// reads the file. Space limits (MariaDB 11.4 max_binlog_total_size), manual
// PURGE BINARY LOGS and RESET MASTER are not predictable and not counted.
func (r BinlogRetention) Headroom(storedFile string, writtenAt time.Time) (float64, error) {
	if len(r.Files) == 0 {
		return math.NaN(), fmt.Errorf("%w: the server lists no binlog files", ErrHeadroomUnknown)
	}
	if storedFile == "" {
		return math.NaN(), fmt.Errorf("%w: no binlog file is stored", ErrHeadroomUnknown)
	}
	oldest, newest := r.Files[0], r.Files[len(r.Files)-1]
	toOldest, ok := compareBinlogNames(storedFile, oldest)
	toNewest, _ := compareBinlogNames(storedFile, newest)
	switch {
	case !ok || toNewest > 0 || (toOldest >= 0 && !contains(r.Files, storedFile)):
		return math.NaN(), fmt.Errorf("%w: %q is not a binlog of this server (its binlogs are %s … %s)",
			ErrHeadroomUnknown, storedFile, oldest, newest)
	case toOldest < 0:
		return 0, fmt.Errorf("%w: %s is older than the oldest binlog, %s", ErrBinlogPurged, storedFile, oldest)
	case r.Expiry <= 0:
		return math.Inf(1), nil
	case storedFile == newest:
		return r.Expiry.Seconds(), nil
	case writtenAt.IsZero():
		return math.NaN(), fmt.Errorf("%w: %s is no longer written and no time it was written at is known",
			ErrHeadroomUnknown, storedFile)
	}
	expiry := r.Expiry.Seconds()
	h := writtenAt.Sub(r.Now).Seconds() + expiry
	return min(max(h, 0), expiry), nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// compareBinlogNames orders two binlog file names "base.NNNNNN" of one
// server by their sequence number (which may outgrow six digits, so plain
// string order is wrong). ok is false when the base names differ or a name
// has no numeric extension.
func compareBinlogNames(a, b string) (cmp int, ok bool) {
	baseA, seqA, okA := splitBinlogName(a)
	baseB, seqB, okB := splitBinlogName(b)
	if !okA || !okB || baseA != baseB {
		return 0, false
	}
	switch {
	case seqA < seqB:
		return -1, true
	case seqA > seqB:
		return 1, true
	}
	return 0, true
}

func splitBinlogName(name string) (base string, seq uint64, ok bool) {
	i := strings.LastIndexByte(name, '.')
	if i <= 0 || i == len(name)-1 {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(name[i+1:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return name[:i], seq, true
}

// UpdateRetentionHeadroom computes RetentionHeadroom and sets the gauge to
// it: 0 when the position is purged, NaN when the headroom is unknown or the
// server could not be asked. It returns RetentionHeadroom's value and error
// (for the caller's log); on a nil *Metrics it only computes.
func (m *Metrics) UpdateRetentionHeadroom(ctx context.Context, db *sql.DB, storedFile string, writtenAt time.Time) (float64, error) {
	h, err := RetentionHeadroom(ctx, db, storedFile, writtenAt)
	if err != nil && !errors.Is(err, ErrBinlogPurged) {
		h = math.NaN()
	}
	m.SetRetentionHeadroom(h)
	return h, err
}
