package checkpoint

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/position"
)

// Delete and Mark are the two ways of acknowledging delivered rows
// (--on-delivered).
const (
	Delete = "delete"
	Mark   = "mark"
)

// Defaults of Config, exported so that the CLI's flags declare the same.
const (
	DefaultRelayName   = "default"
	DefaultTable       = "outbox"
	DefaultOnDelivered = Delete
)

// Config says whose progress row this is and how rows are acknowledged.
// Zero values take the defaults above (SetDefaults).
type Config struct {
	RelayName   string // default DefaultRelayName
	Table       string // the outbox table; default DefaultTable
	OnDelivered string // Delete (default) or Mark
}

var identRE = regexp.MustCompile(`^[A-Za-z0-9_$]{1,64}$`)

// SetDefaults fills the zero values of c with the defaults.
func (c *Config) SetDefaults() {
	if c.RelayName == "" {
		c.RelayName = DefaultRelayName
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.OnDelivered == "" {
		c.OnDelivered = DefaultOnDelivered
	}
}

// MaxRelayName is the longest relay name, in characters: the leader's
// lock, LockName, must fit the 64 characters MySQL allows a user lock's
// name (MySQL refuses a longer one with an error; MariaDB takes it, so a
// longer name would work on one flavor and stop the relay on the other).
const MaxRelayName = 64 - len(lockPrefix)

// CheckRelayName refuses a relay name longer than MaxRelayName characters
// (which also keeps it within the progress table's relay_name column); the
// error names Config.RelayName, the field of this package's Config and
// leadership's.
func CheckRelayName(name string) error {
	if n := utf8.RuneCountInString(name); n > MaxRelayName {
		return fmt.Errorf("Config.RelayName %q is %d characters long: at most %d, as the leader's lock %q must fit the 64 characters MySQL allows a lock name",
			name, n, MaxRelayName, LockName(name))
	}
	return nil
}

// Validate checks c with its defaults filled (SetDefaults); it changes
// nothing. Errors name the Config fields.
func (c *Config) Validate() error {
	d := *c
	d.SetDefaults()
	if err := CheckRelayName(d.RelayName); err != nil {
		return err
	}
	if !identRE.MatchString(d.Table) {
		return fmt.Errorf("Config.Table %q: use letters, digits, _ and $ only (at most 64)", d.Table)
	}
	switch d.OnDelivered {
	case Delete, Mark:
	default:
		return fmt.Errorf("Config.OnDelivered %q: want %q or %q", d.OnDelivered, Delete, Mark)
	}
	return nil
}

// The values of outbox_relay_progress.status.
const (
	StatusActive = "ACTIVE" // the leader reads and publishes
	StatusPaused = "PAUSED" // an operator paused it: the leader keeps leadership and reads nothing further
	StatusFailed = "FAILED" // the last leader stopped on an error a restart does not cure (MarkFailed)
)

// SetByOperator begins the mode reason `checkpoint set` stores (with the
// old and new positions); the next leader logs it.
const SetByOperator = "checkpoint set by an operator"

// Progress is the relay's row in outbox_relay_progress.
type Progress struct {
	RelayName       string
	Position        position.Position
	Mode            string
	ModeReason      string // why it is in Mode; not an error
	Status          string
	Epoch           int64
	LeaderInstance  string
	LeaderSince     time.Time
	LeaderHeartbeat time.Time
	ErrorCount      int64
	LastError       string
	LastEventAt     time.Time
	UpdatedAt       time.Time
	// StreamIDs are the stream destination's publishing ids at Position;
	// nil when the last write of the position was not a stream leader's
	// (or the column holds something unreadable).
	StreamIDs *StreamIDs
}

// StreamIDs is the stream destination's counters at a stored position: for
// each partition of Stream, the publishing id of its last message at or
// before the position (stored as JSON in outbox_relay_progress.stream_ids,
// docs/tables.md). Re-publishing from that position with ids continuing
// from these repeats every id, which the broker drops.
type StreamIDs struct {
	Stream     string   `json:"stream"`
	Partitions int      `json:"partitions"`
	IDs        []uint64 `json:"ids"`
	// Server is the identity of the database server whose binlog the
	// position and ids were read from (its server_uuid, or server_id
	// where there is none): another server may order the same
	// transactions differently, so a term on another server does not
	// continue the ids.
	Server string `json:"server,omitempty"`
	// At is the position the ids were stored with (position.Position's
	// String). A binary without the stream destination (before migration
	// 0010) moves the position without touching stream_ids; a term
	// continues the ids only when At is still the stored position.
	At string `json:"at,omitempty"`
}

// encodeStreamIDs is the column value of ids (nil: NULL).
func encodeStreamIDs(ids *StreamIDs) (any, error) {
	if ids == nil {
		return nil, nil
	}
	b, err := json.Marshal(ids)
	if err != nil {
		return nil, fmt.Errorf("encode stream publishing ids: %w", err)
	}
	return string(b), nil
}

// decodeStreamIDs reads the column; nil for NULL or anything that is not a
// complete value (then the next stream leader starts above the broker's
// last ids: at least once, never a message dropped).
func decodeStreamIDs(col sql.NullString) *StreamIDs {
	if !col.Valid {
		return nil
	}
	var ids StreamIDs
	if err := json.Unmarshal([]byte(col.String), &ids); err != nil || ids.Stream == "" || ids.Partitions != len(ids.IDs) {
		return nil
	}
	return &ids
}

// ErrFenced means the progress row's epoch is no longer ours: another relay
// became leader. The caller must stop publishing at once.
var ErrFenced = errors.New("leadership lost: the progress row belongs to a newer epoch")

// Store reads and writes one relay's progress row.
type Store struct {
	db  *sql.DB
	cfg Config

	ackMu sync.Mutex // serializes Ack, which owns acks
	acks  ackSession
}

// New returns a store over db, which must reach the database holding the
// outbox and progress tables.
func New(db *sql.DB, cfg Config) (*Store, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("checkpoint config: %w", err)
	}
	st := &Store{db: db, cfg: cfg}
	st.acks.s = st
	return st, nil
}

// Config returns the validated configuration.
func (s *Store) Config() Config { return s.cfg }

// Load returns the progress row, creating an empty one on first use.
func (s *Store) Load(ctx context.Context) (Progress, error) {
	if _, err := s.db.ExecContext(ctx,
		"INSERT IGNORE INTO outbox_relay_progress (relay_name) VALUES (?)", s.cfg.RelayName); err != nil {
		return Progress{}, fmt.Errorf("create progress row for relay %q: %w", s.cfg.RelayName, err)
	}
	var (
		p                                     Progress
		flavor, gtid, file, leader, lastError sql.NullString
		reason, streamIDs                     sql.NullString
		pos                                   sql.NullInt64
		since, hb, lastEvent                  sql.NullTime
	)
	err := s.db.QueryRowContext(ctx, `SELECT relay_name, flavor, gtid_set, binlog_file, binlog_pos,
		mode, mode_reason, status, epoch, leader_instance, leader_since, leader_heartbeat, error_count, last_error,
		last_event_at, updated_at, stream_ids FROM outbox_relay_progress WHERE relay_name = ?`, s.cfg.RelayName).Scan(
		&p.RelayName, &flavor, &gtid, &file, &pos, &p.Mode, &reason, &p.Status, &p.Epoch, &leader, &since, &hb,
		&p.ErrorCount, &lastError, &lastEvent, &p.UpdatedAt, &streamIDs)
	if err != nil {
		return Progress{}, fmt.Errorf("read progress row for relay %q: %w", s.cfg.RelayName, err)
	}
	p.Position = position.Position{Flavor: flavor.String, GTIDSet: gtid.String, File: file.String, Pos: uint32(pos.Int64)}
	p.LeaderInstance, p.LastError, p.ModeReason = leader.String, lastError.String, reason.String
	p.LeaderSince, p.LeaderHeartbeat, p.LastEventAt = since.Time, hb.Time, lastEvent.Time
	p.StreamIDs = decodeStreamIDs(streamIDs)
	return p, nil
}

// RecordError counts a failure in the progress row (error_count, last_error)
// so `status` can show it; best effort for a leader of the given epoch.
func (s *Store) RecordError(ctx context.Context, epoch int64, msg string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE outbox_relay_progress SET error_count = error_count + 1,
		last_error = ? WHERE relay_name = ? AND epoch = ?`, truncate(msg, 1024), s.cfg.RelayName, epoch)
	if err != nil {
		return fmt.Errorf("record error for relay %q: %w", s.cfg.RelayName, err)
	}
	return nil
}

// EnsureRow creates relayName's progress row if it is missing. A plain
// read first: INSERT IGNORE of an existing row waits for a lock on it,
// which a stopped leader's transaction may hold for as long as it is
// stopped.
func EnsureRow(ctx context.Context, db *sql.DB, relayName string) error {
	var one int
	err := db.QueryRowContext(ctx, "SELECT 1 FROM outbox_relay_progress WHERE relay_name = ?", relayName).Scan(&one)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("read progress row for relay %q: %w", relayName, err)
	}
	if _, err := db.ExecContext(ctx,
		"INSERT IGNORE INTO outbox_relay_progress (relay_name) VALUES (?)", relayName); err != nil {
		return fmt.Errorf("create progress row for relay %q: %w", relayName, err)
	}
	return nil
}

// LockName is the MySQL user lock (GET_LOCK) that the leader of relayName
// holds (package leadership); MarkFailed marks a relay without a leader
// by finding it free.
func LockName(relayName string) string { return lockPrefix + relayName }

const lockPrefix = "outbox-relay:"

// TableLockName is the MySQL user lock (GET_LOCK) that the leader of the
// relay name publishing outbox table table of database database holds
// beside LockName for its whole term (package leadership): one relay name
// per table. It is 'outbox-relay-table:<database>.<table>', or, when that
// is longer than the 64 characters MySQL allows a lock name,
// 'outbox-relay-table:' and the first 45 hex digits of the SHA-256 of
// '<database>.<table>'.
func TableLockName(database, table string) string {
	const prefix = "outbox-relay-table:"
	name := prefix + database + "." + table
	if len(name) <= 64 {
		return name
	}
	sum := sha256.Sum256([]byte(database + "." + table))
	return prefix + hex.EncodeToString(sum[:])[:64-len(prefix)]
}

// CutReason is reason as the progress row's text columns store it
// (mode_reason, last_error): at most maxReason bytes of valid UTF-8, cut
// on a rune boundary.
func CutReason(reason string) string { return truncate(reason, maxReason) }

// truncate cuts s to at most n bytes on a rune boundary, with invalid UTF-8
// replaced first: the columns are utf8mb4, and a server in strict mode
// refuses an invalid string rather than storing part of it.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// SetMode records a mode change and its reason in the progress row (mode,
// mode_reason) for `status` and operators; last_error is left to errors. An empty mode records only the
// reason: binlog mode is written by the acknowledgements themselves, once
// the poll → binlog handover is complete, so a crash in between repeats the
// handover instead of trusting an old position.
func (s *Store) SetMode(ctx context.Context, epoch int64, mode, reason string) error {
	if err := s.fencedUpdate(ctx, epoch, `UPDATE outbox_relay_progress SET mode = COALESCE(?, mode), mode_reason = ?
		WHERE relay_name = ? AND epoch = ?`, nullIfEmpty(mode), truncate(reason, 1024), s.cfg.RelayName, epoch); err != nil {
		return fmt.Errorf("record mode %q of relay %q: %w", mode, s.cfg.RelayName, err)
	}
	return nil
}

// ClearStreamIDs sets the stored stream publishing ids to NULL, fenced by
// epoch: a term whose ids do not continue them does so before it publishes
// anything through the producers, so that no later term continues ids this
// one pushed the producers past.
func (s *Store) ClearStreamIDs(ctx context.Context, epoch int64) error {
	if err := s.fencedUpdate(ctx, epoch, `UPDATE outbox_relay_progress SET stream_ids = NULL
		WHERE relay_name = ? AND epoch = ?`, s.cfg.RelayName, epoch); err != nil {
		return fmt.Errorf("clear the stored stream publishing ids of relay %q: %w", s.cfg.RelayName, err)
	}
	return nil
}

// fencedUpdate runs an UPDATE of the progress row guarded by "AND epoch =
// epoch", and returns ErrFenced when it changed no row because a newer
// leader holds the row (zero rows also means that nothing changed: the
// epoch read back tells the two apart).
func (s *Store) fencedUpdate(ctx context.Context, epoch int64, query string, args ...any) error {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		var cur int64
		if err := s.db.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ?", s.cfg.RelayName).Scan(&cur); err != nil {
			return err
		}
		if cur != epoch {
			return ErrFenced
		}
	}
	return nil
}

// RecordLastEvent moves last_event_at of the progress row forward to t, the
// created_at of the newest row acknowledged by a leader of the given epoch
// (never backward); for the poller, whose acknowledgements do not go through
// Ack. Best effort: a row of another epoch is left alone.
func (s *Store) RecordLastEvent(ctx context.Context, epoch int64, t time.Time) error {
	if t.IsZero() {
		return nil
	}
	_, err := s.db.ExecContext(ctx, `UPDATE outbox_relay_progress
		SET last_event_at = GREATEST(COALESCE(last_event_at, ?), ?)
		WHERE relay_name = ? AND epoch = ?`, t.UTC(), t.UTC(), s.cfg.RelayName, epoch)
	if err != nil {
		return fmt.Errorf("record last event time of relay %q: %w", s.cfg.RelayName, err)
	}
	return nil
}

// MarkPaused records that this store's leader of epoch has stopped
// reading and publishing for the pause: paused_epoch, which `pause` waits
// for and `checkpoint set` requires. A resume given meanwhile (status no
// longer PAUSED) or a newer leader leaves the row unchanged.
func (s *Store) MarkPaused(ctx context.Context, epoch int64) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE outbox_relay_progress SET paused_epoch = ?
		WHERE relay_name = ? AND epoch = ? AND status = 'PAUSED'`, epoch, s.cfg.RelayName, epoch); err != nil {
		return fmt.Errorf("record the pause of relay %q: %w", s.cfg.RelayName, err)
	}
	return nil
}
