package operator

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// ErrUnknownRelay means no progress row has the relay name asked for.
var ErrUnknownRelay = errors.New("no progress row for this relay name")

// RelayStatus is one progress row as operators see it (`status`,
// `checkpoint show`). Times are UTC; the zero time means none.
type RelayStatus struct {
	RelayName  string
	Table      string       // the outbox table its leaders publish (outbox_table); "" until one of this version led
	Status     string       // ACTIVE, PAUSED or FAILED
	Paused     *PauseState  // nil unless Status is PAUSED
	Failed     *FailedState // nil unless Status is FAILED
	Mode       string       // binlog or poll
	ModeReason string
	Epoch      int64
	Leader     *LeaderState // nil when the row names no leader (none ever, or a clean stop)
	// Broker is the RabbitMQ node the leader publishes to and whether it
	// confirms; nil when the row names none (not connected, paused, no
	// leader). A leader that died keeps its last report: Leader.Alive
	// tells whether it is current.
	Broker      *BrokerState
	Position    position.Position
	ErrorCount  int64
	LastError   string
	LastEventAt time.Time
	UpdatedAt   time.Time
}

// BrokerState is the RabbitMQ side of a leader as the progress row tells
// it (columns broker and confirms_stalled_at).
type BrokerState struct {
	// Node is the node the leader's publisher is connected to, host:port
	// (never credentials).
	Node string
	// Stalled is nil while the broker confirms; otherwise since when it
	// has not confirmed the messages on the wire.
	Stalled *StallState
}

// StallState is a stall of publisher confirms: since when, and how long ago
// by the server's clock.
type StallState struct {
	Since   time.Time
	Seconds float64
}

// PauseState is a pause as the row tells it.
type PauseState struct {
	Since   time.Time // when `pause` was given
	Seconds float64   // how long ago, by the server's clock
	// Stopped: the leader of the row's epoch has stopped reading and
	// publishing for this pause (it holds what it read, acknowledged).
	// False while it is still finishing in-flight messages, or when no
	// leader has seen the pause yet.
	Stopped bool
}

// FailedState is a FAILED status as the row tells it: since when the last
// leader stopped on an error a restart does not cure (the error is
// LastError).
type FailedState struct {
	Since   time.Time
	Seconds float64 // how long ago, by the server's clock
}

// LeaderState is the leader the row names. Alive is false when its
// heartbeat is older than the lease: the process is gone or stuck, and a
// standby (or the next run) takes it over.
type LeaderState struct {
	Instance            string
	Since               time.Time
	HeartbeatAgeSeconds float64
	Alive               bool
	// Lease is the lease the leader recorded it runs with
	// (leader_lease_ms); 0 when it recorded none (a leader of an earlier
	// version). Alive is judged by the lease given to ReadStatus.
	Lease time.Duration
}

// Live reports whether a leader holds the relay now, as far as the row
// tells: one is named and its heartbeat is within the lease.
func (s RelayStatus) Live() bool { return s.Leader != nil && s.Leader.Alive }

// LiveByOwnLease is Live judged by the lease the leader recorded
// (LeaderState.Lease) when it recorded one: a relay of another name, run
// with another --leader-lease than the operator's command was given, is
// live exactly while its leadership is.
func (s RelayStatus) LiveByOwnLease() bool {
	if s.Leader == nil || s.Leader.Lease <= 0 {
		return s.Live()
	}
	return s.Leader.HeartbeatAgeSeconds <= s.Leader.Lease.Seconds()
}

// ReadStatus reads the progress rows: every relay's when relayName is "",
// else that one's (ErrUnknownRelay when it has none). lease is the leader
// lease the relays run with (run's --leader-lease). Ages are computed by the
// server against UTC_TIMESTAMP(6), as the relay writes its times in UTC, so
// neither the session time zone nor this host's clock matters. It creates
// nothing.
func ReadStatus(ctx context.Context, db *sql.DB, relayName string, lease time.Duration) ([]RelayStatus, error) {
	q := `SELECT relay_name, outbox_table, flavor, gtid_set, binlog_file, binlog_pos, mode, mode_reason, status, epoch,
		leader_instance, leader_since, TIMESTAMPDIFF(MICROSECOND, leader_heartbeat, UTC_TIMESTAMP(6)), leader_lease_ms,
		error_count, last_error, last_event_at, updated_at,
		paused_at, TIMESTAMPDIFF(MICROSECOND, paused_at, UTC_TIMESTAMP(6)), paused_epoch,
		failed_at, TIMESTAMPDIFF(MICROSECOND, failed_at, UTC_TIMESTAMP(6)),
		broker, confirms_stalled_at, TIMESTAMPDIFF(MICROSECOND, confirms_stalled_at, UTC_TIMESTAMP(6)) FROM outbox_relay_progress`
	var args []any
	if relayName != "" {
		q += " WHERE relay_name = ?"
		args = append(args, relayName)
	}
	rows, err := db.QueryContext(ctx, q+" ORDER BY relay_name", args...)
	if err != nil {
		return nil, fmt.Errorf("read progress rows: %w", err)
	}
	defer rows.Close()
	var list []RelayStatus
	for rows.Next() {
		var (
			s                                             RelayStatus
			flavor, gtid, file, reason, leader, lastError sql.NullString
			since, lastEvent, updated, pausedAt, failedAt sql.NullString
			broker, stalledAt, table                      sql.NullString
			pos, hbAge, pausedAge, pausedEpoch, failedAge sql.NullInt64
			stalledAge, leaseMS                           sql.NullInt64
		)
		if err := rows.Scan(&s.RelayName, &table, &flavor, &gtid, &file, &pos, &s.Mode, &reason, &s.Status, &s.Epoch,
			&leader, &since, &hbAge, &leaseMS, &s.ErrorCount, &lastError, &lastEvent, &updated,
			&pausedAt, &pausedAge, &pausedEpoch, &failedAt, &failedAge, &broker, &stalledAt, &stalledAge); err != nil {
			return nil, fmt.Errorf("read progress rows: %w", err)
		}
		s.Position = position.Position{Flavor: flavor.String, GTIDSet: gtid.String, File: file.String, Pos: uint32(pos.Int64)}
		s.Table, s.ModeReason, s.LastError = table.String, reason.String, lastError.String
		s.LastEventAt, s.UpdatedAt = parseTime(lastEvent), parseTime(updated)
		if s.Status == checkpoint.StatusPaused {
			s.Paused = &PauseState{Since: parseTime(pausedAt), Seconds: max(float64(pausedAge.Int64)/1e6, 0),
				Stopped: pausedEpoch.Valid && pausedEpoch.Int64 == s.Epoch}
		}
		if s.Status == checkpoint.StatusFailed {
			s.Failed = &FailedState{Since: parseTime(failedAt), Seconds: max(float64(failedAge.Int64)/1e6, 0)}
		}
		if broker.Valid {
			s.Broker = &BrokerState{Node: broker.String}
			if stalledAt.Valid {
				s.Broker.Stalled = &StallState{Since: parseTime(stalledAt), Seconds: max(float64(stalledAge.Int64)/1e6, 0)}
			}
		}
		if leader.Valid {
			age := float64(hbAge.Int64) / 1e6
			s.Leader = &LeaderState{Instance: leader.String, Since: parseTime(since), HeartbeatAgeSeconds: age,
				Alive: hbAge.Valid && age <= lease.Seconds(), Lease: time.Duration(leaseMS.Int64) * time.Millisecond}
		}
		list = append(list, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read progress rows: %w", err)
	}
	if relayName != "" && len(list) == 0 {
		return nil, fmt.Errorf("relay %q: %w", relayName, ErrUnknownRelay)
	}
	return list, nil
}

// parseTime reads a DATETIME(6) scanned as text: the driver's form without
// parseTime, or RFC 3339 with it. The columns hold UTC.
func parseTime(s sql.NullString) time.Time {
	if !s.Valid {
		return time.Time{}
	}
	for _, layout := range []string{"2006-01-02 15:04:05.999999", time.RFC3339Nano} {
		if t, err := time.Parse(layout, s.String); err == nil {
			return t.UTC()
		}
	}
	return time.Time{}
}

// Backlog is what waits in an outbox table.
type Backlog struct {
	PendingRows             int64
	OldestPendingAgeSeconds *float64 // nil when nothing is pending
	FailedRows              int64    // rows of outbox_failed (every source)
}

// ReadBacklog counts the pending rows of table (onDelivered Delete: every
// row present; Mark: rows with delivered_at NULL), the age of the oldest
// (from created_at, UTC) and the rows of outbox_failed. Each count reads its
// whole table (or the pending index): meant for an operator's command, not
// a tight loop.
func ReadBacklog(ctx context.Context, db *sql.DB, table, onDelivered string) (Backlog, error) {
	quoted, err := outbox.QuoteTable(table)
	if err != nil {
		return Backlog{}, fmt.Errorf("read backlog: %w", err)
	}
	where := ""
	switch onDelivered {
	case checkpoint.Delete, "":
	case checkpoint.Mark:
		where = " WHERE delivered_at IS NULL"
	default:
		return Backlog{}, fmt.Errorf("read backlog: on-delivered %q: want %q or %q", onDelivered, checkpoint.Delete, checkpoint.Mark)
	}
	var (
		b   Backlog
		age sql.NullInt64
	)
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) FROM `+
		quoted+where).Scan(&b.PendingRows, &age); err != nil {
		return Backlog{}, fmt.Errorf("count pending rows of %s: %w", table, err)
	}
	if age.Valid {
		a := max(float64(age.Int64)/1e6, 0)
		b.OldestPendingAgeSeconds = &a
	}
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox_failed").Scan(&b.FailedRows); err != nil {
		return Backlog{}, fmt.Errorf("count rows of outbox_failed: %w", err)
	}
	return b, nil
}

// SetPosition is the operator's `checkpoint set`: it writes pos as the
// relay's checkpoint (the other kind of position is cleared, so the row
// never holds two that disagree), mode binlog so the next leader tails from
// exactly pos instead of taking the server's position for a handover, and
// reason as mode_reason; the stream destination's ids are cleared (they do not
// continue pos). It never changes the epoch, and it is fenced by the
// epoch the caller read: ErrFenced when a new leader came meanwhile.
func SetPosition(ctx context.Context, db *sql.DB, relayName string, epoch int64, pos position.Position, reason string) error {
	return SetProgress(ctx, db, relayName, epoch, pos, "binlog", reason)
}

// SetProgress is SetPosition with the mode to store: what `checkpoint set
// --from-relay` copies from another relay name's row, so the next leader
// resumes exactly as a new leader of that name would (binlog: tail from
// pos; poll: the handover, which takes the server's position, as pos is
// older than what the poller delivered). An empty pos stores none: the
// next leader starts as a first start does.
func SetProgress(ctx context.Context, db *sql.DB, relayName string, epoch int64, pos position.Position, mode, reason string) error {
	res, err := db.ExecContext(ctx, `UPDATE outbox_relay_progress SET flavor = ?, gtid_set = ?, binlog_file = ?,
		binlog_pos = ?, stream_ids = NULL, mode = ?, mode_reason = ? WHERE relay_name = ? AND epoch = ?`,
		nullIfEmpty(pos.Flavor), nullIfEmpty(pos.GTIDSet), nullIfEmpty(pos.File), filePos(pos), mode, checkpoint.CutReason(reason), relayName, epoch)
	if err != nil {
		return fmt.Errorf("set checkpoint of relay %q: %w", relayName, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		var cur int64
		if err := db.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ?", relayName).Scan(&cur); err != nil {
			return fmt.Errorf("set checkpoint of relay %q: %w", relayName, err)
		}
		if cur != epoch {
			return checkpoint.ErrFenced
		}
	}
	return nil
}

func filePos(p position.Position) any {
	if p.File == "" {
		return nil
	}
	return p.Pos
}

// nullIfEmpty is NULL for "", else s.
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
