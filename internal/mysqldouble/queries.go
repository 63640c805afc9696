package mysqldouble

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// session is one client connection's handler (go-mysql server.Handler and
// ReplicationHandler).
type session struct {
	s         *Server
	ctx       context.Context // ends when the connection closes
	heartbeat time.Duration   // SET @master_heartbeat_period
}

// gtidSubset is the position check CheckPosition prepares.
const gtidSubset = "SELECT GTID_SUBSET(@@GLOBAL.GTID_PURGED, ?), GTID_SUBSET(?, @@GLOBAL.GTID_EXECUTED)"

func (h *session) UseDB(string) error { return nil }

func (h *session) HandleFieldList(string, string) ([]*mysql.Field, error) {
	return nil, mysql.NewError(mysql.ER_UNKNOWN_ERROR, "the MySQL double has no field lists")
}

func (h *session) HandleStmtPrepare(query string) (int, int, any, error) {
	if normalize(query) != gtidSubset {
		if err := noTable(query); err != nil {
			return 0, 0, nil, err
		}
		return 0, 0, nil, errParse(query)
	}
	return 2, 2, nil, nil
}

// noTable is MySQL's error for a statement on a table: the double has
// none (the relay's own tables live elsewhere in its tests). nil when q
// names no table.
func noTable(q string) error {
	f := strings.Fields(q)
	for i := 0; i+1 < len(f); i++ {
		if strings.EqualFold(f[i], "FROM") && !strings.HasPrefix(strings.ToLower(f[i+1]), "performance_schema.") {
			return mysql.NewError(mysql.ER_NO_SUCH_TABLE, fmt.Sprintf("Table '%s' doesn't exist", strings.Trim(f[i+1], "`")))
		}
	}
	return nil
}

func (h *session) HandleStmtExecute(_ any, query string, args []any) (*mysql.Result, error) {
	if normalize(query) != gtidSubset || len(args) != 2 {
		return nil, errParse(query)
	}
	pos, err := mysql.ParseMysqlGTIDSet(argString(args[0]))
	if err != nil {
		return nil, mysql.NewError(1772, fmt.Sprintf("Malformed GTID set specification '%s'.", argString(args[0])))
	}
	h.s.mu.Lock()
	purgedIn := pos.Contain(h.s.purged)
	inExecuted := h.s.executed.Contain(pos)
	h.s.mu.Unlock()
	rs, err := mysql.BuildSimpleBinaryResultset([]string{"a", "b"}, [][]any{{boolInt(purgedIn), boolInt(inExecuted)}})
	if err != nil {
		return nil, err
	}
	return &mysql.Result{Resultset: rs}, nil
}

func argString(v any) string {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case string:
		return x
	case mysql.TypedBytes:
		return string(x.Bytes)
	}
	return fmt.Sprint(v)
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func (h *session) HandleStmtClose(any) error { return nil }

func (h *session) HandleOtherCommand(cmd byte, _ []byte) error {
	return mysql.NewError(mysql.ER_UNKNOWN_ERROR, fmt.Sprintf("command %d not supported by the MySQL double", cmd))
}

// HandleQuery answers the statements the relay, go-sql-driver and
// go-mysql's syncer send, as Config.Version does.
func (h *session) HandleQuery(query string) (*mysql.Result, error) {
	q := normalize(query)
	s := h.s
	if strings.HasPrefix(q, "SET ") || q == "START TRANSACTION WITH CONSISTENT SNAPSHOT" || q == "ROLLBACK" || q == "COMMIT" {
		if d, ok := heartbeatPeriod(q); ok {
			h.heartbeat = d
		}
		return &mysql.Result{}, nil
	}
	if id, ok := strings.CutPrefix(q, "KILL "); ok {
		return &mysql.Result{}, s.kill(id)
	}
	if err := noTable(q); err != nil && q != "SELECT LOCAL FROM PERFORMANCE_SCHEMA.LOG_STATUS" {
		return nil, err
	}
	cols, rows, err := h.answer(q)
	if err != nil {
		return nil, err
	}
	rs, err := mysql.BuildSimpleTextResultset(cols, rows)
	if err != nil {
		return nil, err
	}
	return &mysql.Result{Resultset: rs}, nil
}

// answer is a statement's columns and rows, or MySQL's error for it.
func (h *session) answer(q string) ([]string, [][]any, error) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.cfg.Version
	one := func(col string, val any) ([]string, [][]any, error) { return []string{col}, [][]any{{val}}, nil }
	global := func(name, def string) string {
		if x, ok := s.cfg.Variables[name]; ok {
			return x
		}
		return def
	}
	gtidMode := "ON"
	if s.cfg.GTIDModeOff {
		gtidMode = "OFF"
	}
	switch q {
	case "SELECT 1":
		return one("1", int64(1))
	case "SELECT VERSION()":
		return one("VERSION()", v.Name)
	case "SELECT @@GLOBAL.GTID_EXECUTED":
		return one("@@GLOBAL.gtid_executed", s.executed.String())
	case "SELECT @@GLOBAL.GTID_PURGED":
		return one("@@GLOBAL.gtid_purged", s.purged.String())
	case "SELECT @@GLOBAL.GTID_MODE":
		return one("@@GLOBAL.gtid_mode", global("gtid_mode", gtidMode))
	case "SELECT @@GLOBAL.REQUIRE_SECURE_TRANSPORT":
		return one("@@GLOBAL.require_secure_transport", int64(0))
	case "SELECT @@GLOBAL.BINLOG_ROW_METADATA":
		return one("@@GLOBAL.binlog_row_metadata", global("binlog_row_metadata", "FULL"))
	case "SELECT @@GLOBAL.LOG_BIN, @@GLOBAL.BINLOG_FORMAT, @@GLOBAL.BINLOG_ROW_IMAGE, @@GLOBAL.SERVER_ID":
		return []string{"@@GLOBAL.log_bin", "@@GLOBAL.binlog_format", "@@GLOBAL.binlog_row_image", "@@GLOBAL.server_id"},
			[][]any{{global("log_bin", "1"), global("binlog_format", "ROW"), global("binlog_row_image", "FULL"), int64(s.cfg.ServerID)}}, nil
	case "SELECT @@GLOBAL.BINLOG_FORMAT, @@GLOBAL.BINLOG_ROW_IMAGE, @@GLOBAL.BINLOG_ROW_METADATA":
		return []string{"@@GLOBAL.binlog_format", "@@GLOBAL.binlog_row_image", "@@GLOBAL.binlog_row_metadata"},
			[][]any{{global("binlog_format", "ROW"), global("binlog_row_image", "FULL"), global("binlog_row_metadata", "FULL")}}, nil
	case "SELECT CURRENT_USER()":
		return one("CURRENT_USER()", s.cfg.User+"@%")
	case "SHOW GRANTS":
		rows := make([][]any, len(s.cfg.Grants))
		for i, g := range s.cfg.Grants {
			rows[i] = []any{g}
		}
		return []string{"Grants for " + s.cfg.User + "@%"}, rows, nil
	case "SHOW GLOBAL VARIABLES LIKE 'BINLOG_CHECKSUM'":
		return []string{"Variable_name", "Value"}, [][]any{{"binlog_checksum", "CRC32"}}, nil
	case "SHOW BINARY LOGS":
		var rows [][]any
		for _, f := range s.files {
			size := int64(4)
			if n := len(f.events); n > 0 {
				size = int64(binary.LittleEndian.Uint32(f.events[n-1].raw[13:]))
			}
			rows = append(rows, []any{f.name, size, "No"})
		}
		return []string{"Log_name", "File_size", "Encrypted"}, rows, nil
	case "SHOW BINARY LOG STATUS", "SHOW MASTER STATUS":
		// SHOW BINARY LOG STATUS came in 8.2; 8.4 removed SHOW MASTER STATUS.
		if q == "SHOW MASTER STATUS" && v.Removed84 || q == "SHOW BINARY LOG STATUS" && !v.Removed84 {
			return nil, nil, errParse(strings.TrimPrefix(q, "SHOW "))
		}
		return []string{"File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB", "Executed_Gtid_Set"},
			[][]any{{s.current().name, int64(s.enc.Pos()), "", "", s.executed.String()}}, nil
	case "SHOW REPLICAS":
		return []string{"Server_Id", "Host", "Port", "Source_Id", "Replica_UUID"}, nil, nil
	case "SHOW SLAVE HOSTS":
		if v.Removed84 {
			return nil, nil, errParse("SLAVE HOSTS")
		}
		return []string{"Server_id", "Host", "Port", "Master_id", "Slave_UUID"}, nil, nil
	case "SELECT LOCAL FROM PERFORMANCE_SCHEMA.LOG_STATUS":
		if !s.granted("BACKUP_ADMIN") {
			return nil, nil, mysql.NewError(mysql.ER_SPECIFIC_ACCESS_DENIED_ERROR,
				"Access denied; you need (at least one of) the BACKUP_ADMIN privilege(s) for this operation")
		}
		local, err := json.Marshal(map[string]any{
			"gtid_executed":       s.executed.String(),
			"binary_log_file":     s.current().name,
			"binary_log_position": s.enc.Pos(),
		})
		if err != nil {
			return nil, nil, err
		}
		return one("LOCAL", string(local))
	}
	// SHOW REPLICA HOSTS is MariaDB's; MySQL does not know it.
	return nil, nil, errParse(q)
}

// HandleRegisterSlave accepts every registration.
func (h *session) HandleRegisterSlave([]byte) error { return nil }

// HandleBinlogDump streams the binlog from a file and offset.
func (h *session) HandleBinlogDump(pos mysql.Position) (*replication.BinlogStreamer, error) {
	s := h.s
	s.mu.Lock()
	if pos.Name == "" {
		pos.Name, pos.Pos = s.files[0].name, 4
	}
	start, err := s.startAt(pos.Name, pos.Pos)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	s.wg.Add(1)
	s.mu.Unlock()
	st := replication.NewBinlogStreamer()
	go s.stream(h.ctx, st, start, nil, h.heartbeat)
	return st, nil
}

// HandleBinlogDumpGTID streams the binlog after have. A set holding
// transactions the server purged is refused as MySQL refuses it.
func (h *session) HandleBinlogDumpGTID(have *mysql.MysqlGTIDSet) (*replication.BinlogStreamer, error) {
	s := h.s
	s.mu.Lock()
	if s.cfg.GTIDModeOff {
		s.mu.Unlock()
		return nil, mysql.NewError(mysql.ER_MASTER_FATAL_ERROR_READING_BINLOG,
			"The replication sender thread cannot start in AUTO_POSITION mode: this server has GTID_MODE = OFF instead of ON.")
	}
	if !have.Contain(s.purged) {
		s.mu.Unlock()
		return nil, mysql.NewError(mysql.ER_MASTER_FATAL_ERROR_READING_BINLOG,
			"Cannot replicate because the source purged required binary logs. Replicate the missing transactions from elsewhere, or provision a new replica from backup.")
	}
	s.wg.Add(1)
	s.mu.Unlock()
	st := replication.NewBinlogStreamer()
	go s.stream(h.ctx, st, dumpStart{}, have, h.heartbeat)
	return st, nil
}

func normalize(q string) string {
	return strings.ToUpper(strings.Join(strings.Fields(strings.TrimSuffix(strings.TrimSpace(q), ";")), " "))
}

// errParse is MySQL's answer to a statement it does not know.
// granted reports whether a line of the grants gives privilege (or ALL
// PRIVILEGES) on *.*. s.mu held.
func (s *Server) granted(privilege string) bool {
	for _, g := range s.cfg.Grants {
		g = strings.ToUpper(g)
		if strings.Contains(g, " ON *.* ") && (strings.Contains(g, privilege) || strings.Contains(g, "ALL PRIVILEGES")) {
			return true
		}
	}
	return false
}

func errParse(q string) error {
	return mysql.NewError(mysql.ER_PARSE_ERROR, fmt.Sprintf(
		"You have an error in your SQL syntax; check the manual that corresponds to your MySQL server version for the right syntax to use near '%s' at line 1", q))
}

// heartbeatPeriod parses SET @master_heartbeat_period = N (nanoseconds).
func heartbeatPeriod(q string) (time.Duration, bool) {
	const key = "@MASTER_HEARTBEAT_PERIOD ="
	i := strings.Index(q, key)
	if i < 0 {
		return 0, false
	}
	rest := strings.TrimSpace(q[i+len(key):])
	if j := strings.IndexAny(rest, ", "); j >= 0 {
		rest = rest[:j]
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(n), true
}
