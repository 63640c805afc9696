package canal

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	driver "github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/position"
)

// DetectFlavor reports "mariadb" or "mysql" from the server's version.
func DetectFlavor(ctx context.Context, db *sql.DB) (string, error) {
	var v string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return "", fmt.Errorf("detect server flavor: %w", err)
	}
	return flavorOf(v), nil
}

// ExecutedGTIDs is every transaction the server's binlog holds or held, in
// flavor's syntax: @@gtid_binlog_state on MariaDB (the highest sequence
// number of every domain and server id, unlike @@gtid_binlog_pos, which
// keeps one per domain), @@gtid_executed on MySQL.
func ExecutedGTIDs(ctx context.Context, db *sql.DB, flavor string) (string, error) {
	q := "SELECT @@GLOBAL.gtid_executed"
	if flavor == FlavorMariaDB {
		q = "SELECT @@GLOBAL.gtid_binlog_state"
	}
	var s sql.NullString
	if err := db.QueryRowContext(ctx, q).Scan(&s); err != nil {
		return "", fmt.Errorf("read the server's executed GTIDs (%s): %w", q, err)
	}
	return s.String, nil
}

// CurrentPosition is the server's position now: @@gtid_binlog_pos on MariaDB
// (always GTID), @@gtid_executed on MySQL with gtid_mode ON, else the file
// and offset of SHOW BINARY LOG STATUS (MySQL 8.2+; 8.4 removed SHOW MASTER
// STATUS, which older servers answer instead). An empty GTID position (no transaction binlogged yet) is returned
// as the zero position.Position of its flavor, which Run streams from the start.
func CurrentPosition(ctx context.Context, db *sql.DB) (position.Position, error) {
	flavor, err := DetectFlavor(ctx, db)
	if err != nil {
		return position.Position{}, err
	}
	p := position.Position{Flavor: flavor}
	if flavor == FlavorMariaDB {
		if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_binlog_pos").Scan(&p.GTIDSet); err != nil {
			return position.Position{}, fmt.Errorf("read @@gtid_binlog_pos: %w", err)
		}
		return p, nil
	}
	var mode string
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_mode").Scan(&mode); err != nil {
		return position.Position{}, fmt.Errorf("read @@gtid_mode: %w", err)
	}
	if strings.EqualFold(mode, "ON") {
		var set string
		if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_executed").Scan(&set); err != nil {
			return position.Position{}, fmt.Errorf("read @@gtid_executed: %w", err)
		}
		p.GTIDSet = strings.ReplaceAll(strings.ReplaceAll(set, "\n", ""), " ", "")
		return p, nil
	}
	rows, err := queryMaps(ctx, db, "SHOW BINARY LOG STATUS")
	if err != nil {
		rows, err = queryMaps(ctx, db, "SHOW MASTER STATUS")
	}
	if err != nil {
		return position.Position{}, fmt.Errorf("read the binlog position (SHOW BINARY LOG STATUS, SHOW MASTER STATUS): %w", err)
	}
	if len(rows) == 0 {
		return position.Position{}, errors.New("read the binlog position: SHOW BINARY LOG STATUS is empty (log_bin is OFF)")
	}
	p.File = rows[0]["file"]
	pos, err := strconv.ParseUint(rows[0]["position"], 10, 32)
	if err != nil {
		return position.Position{}, fmt.Errorf("read the binlog position: bad position.Position %q: %w", rows[0]["position"], err)
	}
	p.Pos = uint32(pos)
	return p, nil
}

// Preflight checks that binlog mode can work with this server and cfg: the
// binlog connection can log in (CheckConnection: a TLS failure is a
// *TLSError), log_bin=ON, binlog_format=ROW, binlog_row_image=FULL,
// binlog_row_metadata=FULL, REPLICATION SLAVE and REPLICATION CLIENT granted
// to db's user (which should be cfg.User), and cfg.ServerID unused by the
// server and its registered replicas. One failure is returned as a
// *PreflightError whose one-line message names the fix; several as
// PreflightErrors, whose one line lists each with its fix (errors.As finds
// the first *PreflightError through it).
//
// Settings are read GLOBAL: they are what new writer sessions get. A writer
// that changes binlog_format or binlog_row_image in its own session is not
// detectable here; the tailer reports what it sees in the stream instead.
//
// A clash with another replica's server id is detected through SHOW REPLICA
// HOSTS, which lists the replicas and binlog clients that registered (every
// go-mysql tailer does). MariaDB 10.5+ allows that statement only with
// REPLICATION MASTER ADMIN, which binlog mode does not otherwise need (and
// which also lets a user set server_id and gtid_binlog_state): without it
// the check is skipped, and the reason, in words, goes to
// cfg.OnServerIDUnchecked, or is logged as a warning when that is nil.
func Preflight(ctx context.Context, db *sql.DB, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := CheckConnection(ctx, cfg); err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	flavor := cfg.Flavor
	if flavor == "" {
		var err error
		if flavor, err = DetectFlavor(ctx, db); err != nil {
			return err
		}
	}
	// Every failing setting and grant is collected, so one run names all
	// the fixes instead of one per restart.
	fails, serverID, err := checkSettings(ctx, db)
	if err != nil {
		return err
	}
	grantFails, err := checkGrants(ctx, db, flavor)
	if err != nil {
		return err
	}
	fails = append(fails, grantFails...)
	if cfg.ServerID == serverID {
		fails = append(fails, &PreflightError{Check: CheckServerID,
			Problem: fmt.Sprintf("server id %d is the server's own @@server_id", cfg.ServerID),
			Fix:     "choose another Config.ServerID, unique among the server and its replicas and binlog clients"})
	}
	switch len(fails) {
	case 0:
	case 1:
		return fails[0]
	default:
		// The clash with other replicas (below) is checked once these are
		// fixed: it may wait for a stale registration to go.
		return PreflightErrors(fails)
	}
	return awaitServerIDFree(ctx, db, cfg, flavor)
}

// checkSettings reads the server's GLOBAL binlog settings and returns a
// *PreflightError for each that binlog mode cannot work with (log_bin,
// binlog_format, binlog_row_image, binlog_row_metadata, in that order), and
// the server's own @@server_id. A failed read is the error.
func checkSettings(ctx context.Context, db *sql.DB) ([]*PreflightError, uint32, error) {
	var logBin, format, image string
	var serverID uint32
	err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.log_bin, @@GLOBAL.binlog_format, @@GLOBAL.binlog_row_image, @@GLOBAL.server_id").
		Scan(&logBin, &format, &image, &serverID)
	if err != nil {
		return nil, 0, fmt.Errorf("preflight: read binlog settings: %w", err)
	}
	var fails []*PreflightError
	if logBin != "1" && !strings.EqualFold(logBin, "ON") {
		fails = append(fails, &PreflightError{Check: CheckLogBin, Problem: "log_bin is OFF (the server writes no binlog)",
			Fix: "enable the binary log: my.cnf [mysqld] log-bin=<name>, then restart the server (log_bin cannot change at runtime)"})
	}
	if !strings.EqualFold(format, "ROW") {
		fails = append(fails, &PreflightError{Check: CheckFormat, Problem: "binlog_format is " + format,
			Fix: "set binlog_format=ROW (my.cnf [mysqld] binlog-format=ROW, or SET GLOBAL binlog_format='ROW')"})
	}
	if !strings.EqualFold(image, "FULL") {
		fails = append(fails, &PreflightError{Check: CheckRowImage, Problem: "binlog_row_image is " + image,
			Fix: "set binlog_row_image=FULL (my.cnf [mysqld] binlog-row-image=FULL, or SET GLOBAL binlog_row_image='FULL')"})
	}
	metaFail, err := checkRowMetadata(ctx, db)
	if err != nil {
		return nil, 0, err
	}
	if metaFail != nil {
		fails = append(fails, metaFail)
	}
	return fails, serverID, nil
}

// checkRowMetadata returns a *PreflightError when binlog_row_metadata is
// not FULL or the server has no such variable (too old), nil when it is
// FULL; a failed read is the error.
func checkRowMetadata(ctx context.Context, db *sql.DB) (*PreflightError, error) {
	var meta string
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.binlog_row_metadata").Scan(&meta); err != nil {
		var me *driver.MySQLError
		if !errors.As(err, &me) || me.Number != 1193 { // unknown system variable
			return nil, fmt.Errorf("preflight: read binlog_row_metadata: %w", err)
		}
		return &PreflightError{Check: CheckRowMetadata, Problem: "the server has no binlog_row_metadata (too old)",
			Fix: "use MySQL 8.0.1+ or MariaDB 10.5+ and set binlog_row_metadata=FULL"}, nil
	}
	if !strings.EqualFold(meta, "FULL") {
		return &PreflightError{Check: CheckRowMetadata, Problem: "binlog_row_metadata is " + meta,
			Fix: "set binlog_row_metadata=FULL (my.cnf [mysqld] binlog-row-metadata=FULL, or SET GLOBAL binlog_row_metadata='FULL')"}, nil
	}
	return nil, nil
}

// awaitServerIDFree returns nil when no other registered replica or binlog
// client uses cfg.ServerID, when the one that does is this relay's own
// leader (cfg.OwnServerID), or when the replicas cannot be listed (the
// reason goes to cfg.OnServerIDUnchecked, or is logged as a warning); the
// clash as a *PreflightError when it outlasts two heartbeat periods; ctx's
// error when ctx ends first.
//
// A relay restarted right after a crash finds its own dead binlog
// connection still registered under its id: the server only notices the
// dead peer when a heartbeat write fails. So a clash counts only when it
// outlasts two heartbeat periods; a live client keeps its registration.
func awaitServerIDFree(ctx context.Context, db *sql.DB, cfg Config, flavor string) error {
	log := cfg.Logger.Named("canal")
	deadline := time.Now().Add(2*cfg.HeartbeatPeriod + time.Second)
	for {
		clash, err := serverIDClash(ctx, db, cfg.ServerID)
		if err != nil {
			reason := serverIDUnchecked(ctx, db, flavor, cfg.ServerID, err)
			if cfg.OnServerIDUnchecked != nil {
				cfg.OnServerIDUnchecked(reason)
			} else {
				log.Warn("preflight: " + reason)
			}
			return nil
		}
		if clash != nil && cfg.OwnServerID != nil && cfg.OwnServerID(ctx) {
			log.Info("preflight: server id in use by this relay's own leader; this instance stands by",
				zap.Uint32("server_id", cfg.ServerID))
			return nil
		}
		if clash == nil || time.Now().After(deadline) {
			return clash
		}
		log.Info("preflight: server id in use by a registered binlog client; waiting to see whether it is a stale connection",
			zap.Uint32("server_id", cfg.ServerID))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// serverIDClash returns a *PreflightError when a registered replica or
// binlog client uses id.
func serverIDClash(ctx context.Context, db *sql.DB, id uint32) (error, error) {
	replicas, stmt, err := replicaHosts(ctx, db)
	if err != nil {
		return nil, err
	}
	for _, r := range replicas {
		if r["server_id"] == strconv.FormatUint(uint64(id), 10) {
			return &PreflightError{Check: CheckServerID,
				Problem: fmt.Sprintf("server id %d is used by a connected replica or binlog client (%s: host %q port %s)",
					id, stmt, r["host"], r["port"]),
				Fix: "choose another Config.ServerID, or stop the other client (two clients with one id disconnect each other)"}, nil
		}
	}
	return nil, nil
}

// replicaHosts lists the registered replicas with the first statement the
// server knows: SHOW REPLICA HOSTS (MariaDB 10.5+), SHOW REPLICAS (MySQL
// 8.0.22+), SHOW SLAVE HOSTS (older). A statement the server does not know
// (a syntax error) is passed over; a refusal is a *replicasDeniedError.
func replicaHosts(ctx context.Context, db *sql.DB) ([]map[string]string, string, error) {
	var denied *replicasDeniedError
	for _, stmt := range []string{"SHOW REPLICA HOSTS", "SHOW REPLICAS", "SHOW SLAVE HOSTS"} {
		rows, err := queryMaps(ctx, db, stmt)
		var me *driver.MySQLError
		switch {
		case err == nil:
			return rows, stmt, nil
		case errors.As(err, &me) && me.Number == 1064: // ER_PARSE_ERROR: another server's statement
			continue
		case errors.As(err, &me) && isAccessDenied(me.Number):
			if denied == nil {
				denied = &replicasDeniedError{stmt: stmt, err: err}
			}
			continue
		default:
			return nil, stmt, fmt.Errorf("list the server's replicas (%s): %w", stmt, err)
		}
	}
	if denied != nil {
		return nil, denied.stmt, denied
	}
	return nil, "", errors.New("list the server's replicas: the server knows none of SHOW REPLICA HOSTS, SHOW REPLICAS, SHOW SLAVE HOSTS")
}

// replicasDeniedError: the user may not list the server's replicas.
type replicasDeniedError struct {
	stmt string
	err  error
}

func (e *replicasDeniedError) Error() string {
	return fmt.Sprintf("list the server's replicas (%s): %v", e.stmt, e.err)
}
func (e *replicasDeniedError) Unwrap() error { return e.err }

// isAccessDenied reports whether a MySQL error number is a refusal for
// want of a privilege: ER_DBACCESS_DENIED_ERROR, ER_TABLEACCESS_DENIED_ERROR,
// ER_COLUMNACCESS_DENIED_ERROR, ER_SPECIFIC_ACCESS_DENIED_ERROR.
func isAccessDenied(n uint16) bool { return n == 1044 || n == 1142 || n == 1143 || n == 1227 }

// serverIDUnchecked says in words why id could not be checked against the
// server's other replicas, and what to do.
func serverIDUnchecked(ctx context.Context, db *sql.DB, flavor string, id uint32, err error) string {
	var denied *replicasDeniedError
	if !errors.As(err, &denied) {
		return fmt.Sprintf("server id %d not checked against the server's other replicas and binlog clients (%v); "+
			"make sure Config.ServerID is unique among them (two clients with one id make the server drop one of the connections)", id, err)
	}
	priv := "REPLICATION MASTER ADMIN"
	if flavor == FlavorMySQL {
		priv = "REPLICATION SLAVE"
	}
	account, aerr := CurrentAccount(ctx, db)
	if aerr != nil {
		account = "this user"
	}
	return fmt.Sprintf("server id %d not checked against the server's other replicas and binlog clients: listing them (%s) "+
		"needs the %s privilege, which %s lacks; make sure Config.ServerID is unique among them by hand (two clients with one id "+
		"make the server drop one of the connections), or GRANT %s ON *.* TO %s to have it checked",
		id, denied.stmt, priv, account, priv, account)
}

// Privileges that satisfy each replication grant, as SHOW GRANTS prints them.
// MariaDB 10.5+ renamed REPLICATION CLIENT to BINLOG MONITOR (the old name is
// an alias and SHOW GRANTS prints the new one).
var (
	replSlaveEquivalents  = []string{"REPLICATION SLAVE", "ALL PRIVILEGES", "ALL"}
	replClientEquivalents = []string{"REPLICATION CLIENT", "BINLOG MONITOR", "ALL PRIVILEGES", "ALL"}
)

func checkGrants(ctx context.Context, db *sql.DB, flavor string) ([]*PreflightError, error) {
	account, err := CurrentAccount(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	rows, err := db.QueryContext(ctx, "SHOW GRANTS")
	if err != nil {
		return nil, fmt.Errorf("preflight: SHOW GRANTS: %w", err)
	}
	defer rows.Close()
	var grants []string
	for rows.Next() {
		var g string
		if err := rows.Scan(&g); err != nil {
			return nil, fmt.Errorf("preflight: SHOW GRANTS: %w", err)
		}
		grants = append(grants, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("preflight: SHOW GRANTS: %w", err)
	}
	privs := globalPrivileges(grants)
	var fails []*PreflightError
	if !hasAny(privs, replSlaveEquivalents) {
		fails = append(fails, &PreflightError{Check: CheckReplSlave,
			Problem: fmt.Sprintf("user %s lacks REPLICATION SLAVE (the binlog dump would fail with a misleading access error)", account),
			Fix:     fmt.Sprintf("GRANT REPLICATION SLAVE ON *.* TO %s", account)})
	}
	if !hasAny(privs, replClientEquivalents) {
		name, problem := "REPLICATION CLIENT", "REPLICATION CLIENT"
		if flavor == FlavorMariaDB {
			// MariaDB 10.5 renamed it; SHOW GRANTS prints the new name.
			name, problem = "BINLOG MONITOR", "BINLOG MONITOR (called REPLICATION CLIENT before MariaDB 10.5)"
		}
		fails = append(fails, &PreflightError{Check: CheckReplClient,
			Problem: fmt.Sprintf("user %s lacks %s, needed to read binlog positions and list binlogs", account, problem),
			Fix:     fmt.Sprintf("GRANT %s ON *.* TO %s", name, account)})
	}
	return fails, nil
}

// globalPrivileges extracts the privileges granted ON *.* from SHOW GRANTS
// lines such as "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `u`@`%`".
// Role grants ("GRANT `r` TO `u`") and object-level grants are ignored: the
// replication privileges are global only.
func globalPrivileges(lines []string) map[string]bool {
	privs := make(map[string]bool)
	for _, line := range lines {
		up := strings.ToUpper(line)
		if !strings.HasPrefix(up, "GRANT ") {
			continue
		}
		on := strings.Index(up, " ON *.* TO ")
		if on < 0 {
			continue
		}
		for p := range strings.SplitSeq(up[len("GRANT "):on], ",") {
			privs[strings.Join(strings.Fields(p), " ")] = true
		}
	}
	return privs
}

func hasAny(privs map[string]bool, names []string) bool {
	for _, n := range names {
		if privs[n] {
			return true
		}
	}
	return false
}

// CurrentAccount is the account db's user logged in as, the way GRANT
// names it: 'user'@'host', from CURRENT_USER() (the host is the pattern the
// server matched, e.g. '%').
func CurrentAccount(ctx context.Context, db *sql.DB) (string, error) {
	var user string
	if err := db.QueryRowContext(ctx, "SELECT CURRENT_USER()").Scan(&user); err != nil {
		return "", fmt.Errorf("read CURRENT_USER(): %w", err)
	}
	return quoteAccount(user), nil
}

// quoteAccount turns CURRENT_USER()'s "user@host" into 'user'@'host'.
func quoteAccount(u string) string {
	i := strings.LastIndexByte(u, '@')
	if i < 0 {
		return "'" + u + "'"
	}
	return "'" + u[:i] + "'@'" + u[i+1:] + "'"
}

// CheckPosition reports whether the server can still stream from pos: a
// *PurgedError when the binlogs after it were purged or when pos is not in
// the server's history (ahead of it: diverged). The zero position is always
// available.
//
// MariaDB: each domain of pos is compared with BINLOG_GTID_POS(oldest binlog,
// 4), the GTID state at the start of the oldest retained binlog (a domain
// there but missing from pos would replay from its purged start), and with
// @@gtid_binlog_pos (a sequence ahead of the server is a divergence). MySQL:
// @@gtid_purged must be a subset of pos and pos of @@gtid_executed. File
// positions: the file must still be listed by SHOW BINARY LOGS.
func CheckPosition(ctx context.Context, db *sql.DB, pos position.Position) error {
	if pos.IsZero() {
		return nil
	}
	flavor := pos.Flavor
	if flavor == "" {
		var err error
		if flavor, err = DetectFlavor(ctx, db); err != nil {
			return err
		}
	}
	logs, err := BinaryLogs(ctx, db)
	if err != nil {
		return fmt.Errorf("check position %s: %w", pos, err)
	}
	if !pos.GTIDMode() {
		for _, l := range logs {
			if l.Name == pos.File {
				if uint64(pos.Pos) > l.Size {
					return &PurgedError{Position: pos, Detail: fmt.Sprintf("offset %d is beyond the end of %s (%d bytes)", pos.Pos, pos.File, l.Size)}
				}
				return nil
			}
		}
		return &PurgedError{Position: pos, Detail: fmt.Sprintf("binlog %s is not in SHOW BINARY LOGS (oldest is %s)", pos.File, logs[0].Name)}
	}
	if flavor == FlavorMySQL {
		var notPurged, known bool
		err := db.QueryRowContext(ctx, "SELECT GTID_SUBSET(@@GLOBAL.gtid_purged, ?), GTID_SUBSET(?, @@GLOBAL.gtid_executed)",
			pos.GTIDSet, pos.GTIDSet).Scan(&notPurged, &known)
		if err != nil {
			return fmt.Errorf("check position %s: %w", pos, err)
		}
		if !notPurged {
			return &PurgedError{Position: pos, Detail: "@@gtid_purged holds transactions the position has not seen"}
		}
		if !known {
			return &PurgedError{Position: pos, Detail: "the position holds transactions the server never executed (diverged)"}
		}
		return nil
	}

	have, err := position.ParseGTIDSet(FlavorMariaDB, pos.GTIDSet)
	if err != nil {
		return fmt.Errorf("check position: %w", err)
	}
	oldestFile := logs[0].Name
	var oldestState, current sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT BINLOG_GTID_POS(?, 4), @@GLOBAL.gtid_binlog_pos", oldestFile).Scan(&oldestState, &current); err != nil {
		return fmt.Errorf("check position %s: read the GTID state of %s: %w", pos, oldestFile, err)
	}
	oldest, err := position.ParseGTIDSet(FlavorMariaDB, oldestState.String)
	if err != nil {
		return fmt.Errorf("check position: GTID state of %s: %w", oldestFile, err)
	}
	cur, err := position.ParseGTIDSet(FlavorMariaDB, current.String)
	if err != nil {
		return fmt.Errorf("check position: @@gtid_binlog_pos: %w", err)
	}
	haveSets := have.(*mysql.MariadbGTIDSet).Sets
	for d, o := range oldest.(*mysql.MariadbGTIDSet).Sets {
		h, ok := haveSets[d]
		if !ok {
			return &PurgedError{Position: pos, Detail: fmt.Sprintf("domain %d is missing from the position and its start was purged: the oldest binlog %s begins after %s", d, oldestFile, o)}
		}
		if h.SequenceNumber < o.SequenceNumber {
			return &PurgedError{Position: pos, Detail: fmt.Sprintf("the oldest binlog %s begins after %s, the position is at %s", oldestFile, o, h)}
		}
	}
	curSets := cur.(*mysql.MariadbGTIDSet).Sets
	for d, h := range haveSets {
		c, ok := curSets[d]
		if !ok || h.SequenceNumber > c.SequenceNumber {
			return &PurgedError{Position: pos, Detail: fmt.Sprintf("the position's %s is not in the server's binlog (gtid_binlog_pos %s): diverged", h, current.String)}
		}
	}
	return nil
}

// PreflightErrors is every failed check of one Preflight, in check order.
type PreflightErrors []*PreflightError

func (e PreflightErrors) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d server settings prevent binlog mode:", len(e))
	for i, pe := range e {
		fmt.Fprintf(&b, " (%d) %s", i+1, pe.Error())
		if i < len(e)-1 {
			b.WriteByte(';')
		}
	}
	return b.String()
}

// Unwrap lets errors.As find each *PreflightError.
func (e PreflightErrors) Unwrap() []error {
	out := make([]error, len(e))
	for i, pe := range e {
		out[i] = pe
	}
	return out
}

// queryMaps runs a statement whose columns vary across versions and returns
// its rows as lower-cased column name → text value.
func queryMaps(ctx context.Context, db *sql.DB, stmt string) ([]map[string]string, error) {
	rows, err := db.QueryContext(ctx, stmt)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var out []map[string]string
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		m := make(map[string]string, len(cols))
		for i, c := range cols {
			m[strings.ToLower(c)] = vals[i].String
		}
		out = append(out, m)
	}
	return out, rows.Err()
}
