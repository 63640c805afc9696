package canal

// This file maps wall-clock times to binlog positions: the start time of a
// binlog file, and the first transaction at or after a time. Replays by time
// (outbox-relay replay --from-time/--to-time) use it.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/position"
)

// BinlogFile is one binary log the server still has.
type BinlogFile struct {
	Name string
	Size uint64 // bytes; for the file being written, its end when listed
}

// BinaryLogs lists SHOW BINARY LOGS, oldest first. An empty list (binlog
// off) is an error.
func BinaryLogs(ctx context.Context, db *sql.DB) ([]BinlogFile, error) {
	rows, err := queryMaps(ctx, db, "SHOW BINARY LOGS")
	if err != nil {
		return nil, fmt.Errorf("list binary logs (SHOW BINARY LOGS): %w", err)
	}
	if len(rows) == 0 {
		return nil, errors.New("list binary logs: the server has none (log_bin is OFF)")
	}
	files := make([]BinlogFile, len(rows))
	for i, r := range rows {
		size, err := strconv.ParseUint(r["file_size"], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("list binary logs: size %q of %s: %w", r["file_size"], r["log_name"], err)
		}
		files[i] = BinlogFile{Name: r["log_name"], Size: size}
	}
	return files, nil
}

// TimePoint is where a time falls in the binlog, as TimePosition found it.
type TimePoint struct {
	// Found: a transaction whose event time is at or after the time exists
	// in the binlog as it was when the search began; File, Pos and Time are
	// its first event. Otherwise File and Pos are the end of the binlog then.
	Found bool
	File  string
	Pos   uint32
	Time  time.Time // the transaction's event time (whole seconds, UTC)
	// Position is the position just before that transaction (or the end):
	// streaming after it starts with the transaction. MariaDB: from
	// BINLOG_GTID_POS; MySQL with GTIDs: the file's Previous_gtids plus the
	// transactions read before the point; without GTIDs: File and Pos.
	Position position.Position

	// Oldest is the oldest binlog file, OldestStart its start time. When
	// BeforeOldest, the time is earlier than that start: transactions of
	// the time may have been purged (the caller decides), and the search
	// began at the oldest file.
	Oldest       string
	OldestStart  time.Time
	BeforeOldest bool
	// FilesProbed is how many files' start times were read (a binary
	// search: about log2 of the number of files).
	FilesProbed int
}

// TimePosition finds the first transaction whose binlog event time is at or
// after at, compared in whole seconds (at is truncated to the second). The
// event time of a transaction is that of its GTID event: on MariaDB and MySQL
// the start of the statement that committed it.
//
// It reads the start time of binlog files (the time of their first event)
// by binary search over SHOW BINARY LOGS, starting with the newest, then
// reads forward from the start of the last file that began at or before at,
// into later files if needed, up to the end of the binlog as it was when the
// search began. Each read is a short binlog dump with the Tailer's server id,
// so it must not run while a Run of the same Tailer streams.
//
// Event times in the binlog are close to ordered but not strictly: a
// statement that started before a file was opened can commit into it, and a
// session may set its own timestamp. TimePosition returns the first
// transaction in binlog order that qualifies.
func (t *Tailer) TimePosition(ctx context.Context, db *sql.DB, at time.Time) (TimePoint, error) {
	flavor := t.cfg.Flavor
	if flavor == "" {
		var err error
		if flavor, err = DetectFlavor(ctx, db); err != nil {
			return TimePoint{}, err
		}
	}
	files, err := BinaryLogs(ctx, db)
	if err != nil {
		return TimePoint{}, err
	}
	sec := at.Unix()
	starts := make(map[int]int64, 8)
	var tp TimePoint
	startOf := func(i int) (int64, error) {
		if s, ok := starts[i]; ok {
			return s, nil
		}
		st, err := t.fileStart(ctx, flavor, files[i].Name)
		if err != nil {
			return 0, err
		}
		tp.FilesProbed++
		starts[i] = st.Unix()
		return st.Unix(), nil
	}
	// The last file whose start is at or before sec: starts are in file
	// order (each file is opened when the one before it is closed). The
	// newest is probed first: most searches are for recent times.
	lo, hi := 0, len(files)-1 // answer in [lo, hi]; lo = 0 may also mean "before all"
	switch s, err := startOf(hi); {
	case err != nil:
		return TimePoint{}, err
	case s <= sec:
		lo = hi
	case hi > 0:
		hi--
	}
	for lo < hi {
		mid := (lo + hi + 1) / 2
		s, err := startOf(mid)
		if err != nil {
			return TimePoint{}, err
		}
		if s <= sec {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	oldestStart, err := startOf(0)
	if err != nil {
		return TimePoint{}, err
	}
	tp.Oldest, tp.OldestStart, tp.BeforeOldest = files[0].Name, time.Unix(oldestStart, 0).UTC(), sec < oldestStart

	end := files[len(files)-1]
	executed, err := t.scanFrom(ctx, flavor, files[lo].Name, end, sec, &tp)
	if err != nil {
		return TimePoint{}, err
	}
	switch {
	case flavor == FlavorMariaDB:
		var set sql.NullString
		if err := db.QueryRowContext(ctx, "SELECT BINLOG_GTID_POS(?, ?)", tp.File, tp.Pos).Scan(&set); err != nil {
			return TimePoint{}, fmt.Errorf("GTID position at %s:%d (BINLOG_GTID_POS): %w", tp.File, tp.Pos, err)
		}
		if !set.Valid {
			return TimePoint{}, fmt.Errorf("GTID position at %s:%d: BINLOG_GTID_POS is NULL (no such binlog or offset)", tp.File, tp.Pos)
		}
		tp.Position = position.Position{Flavor: flavor, GTIDSet: set.String}
	case executed != nil && mysqlGTIDMode(ctx, db):
		tp.Position = position.Position{Flavor: flavor, GTIDSet: executed.String()}
	default:
		tp.Position = position.Position{Flavor: flavor, File: tp.File, Pos: tp.Pos}
	}
	return tp, nil
}

// mysqlGTIDMode reports whether a MySQL server has gtid_mode ON.
func mysqlGTIDMode(ctx context.Context, db *sql.DB) bool {
	var mode string
	err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_mode").Scan(&mode)
	return err == nil && strings.EqualFold(mode, "ON")
}

// dumpConfig is the syncer configuration of the short reads of this file:
// the Tailer's connection and server id, rows left undecoded.
func (t *Tailer) dumpConfig(flavor string) replication.BinlogSyncerConfig {
	c := t.syncerConfig(flavor)
	c.RowsEventDecodeFunc = func(re *replication.RowsEvent, data []byte) error {
		_, err := re.DecodeHeader(data) // the parser needs the end-of-statement flag
		return err
	}
	c.DiscardGTIDSet = true
	return c
}

// fileStart returns the time of the first event of a binlog file (its
// format description event, written when the server opened the file).
func (t *Tailer) fileStart(ctx context.Context, flavor, file string) (time.Time, error) {
	syncer, st, err := t.openSyncer(t.dumpConfig(flavor), func(syncer *replication.BinlogSyncer) (*replication.BinlogStreamer, error) {
		return syncer.StartSync(mysql.Position{Name: file, Pos: 4})
	})
	if syncer != nil {
		defer syncer.Close()
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("read the start of binlog %s: %w", file, err)
	}
	for {
		ev, err := st.GetEvent(ctx)
		if err != nil {
			return time.Time{}, fmt.Errorf("read the start of binlog %s: %w", file, t.dumpError(err))
		}
		// The dump begins with an artificial rotate event of time 0.
		if ev.Header.Timestamp != 0 && ev.Header.EventType != replication.HEARTBEAT_EVENT &&
			ev.Header.EventType != replication.HEARTBEAT_LOG_EVENT_V2 {
			return time.Unix(int64(ev.Header.Timestamp), 0).UTC(), nil
		}
	}
}

// scanFrom reads from the start of file until the first transaction whose
// event time is at or after sec, or until end, and records the point in tp
// (File, Pos, Time, Found). On MySQL it returns the GTID set executed before
// the point (the file's Previous_gtids plus the transactions read before the
// point); nil on MariaDB or when the files have no Previous_gtids.
func (t *Tailer) scanFrom(ctx context.Context, flavor, file string, end BinlogFile, sec int64, tp *TimePoint) (*mysql.MysqlGTIDSet, error) {
	syncer, st, err := t.openSyncer(t.dumpConfig(flavor), func(syncer *replication.BinlogSyncer) (*replication.BinlogStreamer, error) {
		return syncer.StartSync(mysql.Position{Name: file, Pos: 4})
	})
	if syncer != nil {
		defer syncer.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("read binlog %s: %w", file, err)
	}
	cur := file
	var executed *mysql.MysqlGTIDSet // MySQL: the GTID set before the event being read
	for {
		ev, err := st.GetEvent(ctx)
		if err != nil {
			return nil, fmt.Errorf("read binlog from %s to find a time: %w", file, t.dumpError(err))
		}
		h := ev.Header
		var gtid func()
		switch e := ev.Event.(type) {
		case *replication.RotateEvent:
			cur = string(e.NextLogName)
			continue
		case *replication.PreviousGTIDsEvent:
			set, err := mysql.ParseMysqlGTIDSet(e.GTIDSets)
			if err != nil {
				return nil, fmt.Errorf("binlog %s: Previous_gtids %q: %w", cur, e.GTIDSets, err)
			}
			executed = set.(*mysql.MysqlGTIDSet)
		case *replication.MariadbGTIDEvent:
			gtid = func() {}
		case *replication.GTIDEvent:
			gtid = mysqlAdder(executed, e.SID, mysql.Tag{}, e.GNO)
		case *replication.GtidTaggedLogEvent:
			gtid = mysqlAdder(executed, e.SID, e.Tag, e.GNO)
		}
		if gtid != nil {
			start := h.LogPos - h.EventSize
			if int64(h.Timestamp) >= sec {
				tp.Found, tp.File, tp.Pos = true, cur, start
				tp.Time = time.Unix(int64(h.Timestamp), 0).UTC()
				return executed, nil
			}
			gtid()
		}
		// The end of the binlog as listed when the search began; a
		// heartbeat carries the current end too.
		if cur == end.Name && uint64(h.LogPos) >= end.Size {
			tp.File, tp.Pos = end.Name, uint32(end.Size)
			return executed, nil
		}
	}
}

func mysqlAdder(set *mysql.MysqlGTIDSet, sid []byte, tag mysql.Tag, gno int64) func() {
	return func() {
		u, err := uuid.FromBytes(sid)
		if set == nil || err != nil || gno <= 0 { // anonymous (no GTIDs)
			return
		}
		set.AddGTIDWithTag(u, tag, gno)
	}
}

// dumpError turns the server's refusal of a dump into the tailer's errors.
func (t *Tailer) dumpError(err error) error {
	var me *mysql.MyError
	if errors.As(err, &me) {
		switch me.Code {
		case mysql.ER_MASTER_FATAL_ERROR_READING_BINLOG:
			return fmt.Errorf("the server refused the binlog dump (purged meanwhile, or server id %d in use?): %w", t.cfg.ServerID, err)
		case mysql.ER_ACCESS_DENIED_ERROR, mysql.ER_SPECIFIC_ACCESS_DENIED_ERROR:
			return &AccessError{User: t.cfg.User, Detail: me.Message}
		}
	}
	return err
}
