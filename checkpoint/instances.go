package checkpoint

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// The roles of a row of outbox_relay_instances.
const (
	RoleLeader  = "leader"  // the process took leadership (written once per term)
	RoleStandby = "standby" // the process waits for leadership (written each time it looks)
)

// InstanceRetention is how long a row of outbox_relay_instances whose
// heartbeat has stopped is kept: a process that died without a clean stop
// stays visible (not alive) this long, then BeatInstance of any process of
// the relay name deletes it.
const InstanceRetention = time.Hour

// BeatInstance records this process (Config.Instance) in
// outbox_relay_instances under Config.RelayName with role (RoleLeader or
// RoleStandby): it inserts the row, or updates role and heartbeat of the
// existing one (started_at stays the time of the first beat). The heartbeat
// is UTC_TIMESTAMP(6). In the same call it deletes the relay name's rows
// whose heartbeat is older than InstanceRetention, processes that died long
// ago (its own row is fresh by then), at most once per pruneEvery of this
// Store, so that a standby's look costs one statement here.
//
// Only a standby beats on every look for leadership; a leader beats once
// when its term starts, as its liveness is leader_heartbeat in the progress
// row. So the row of a leader whose term lasts longer than
// InstanceRetention may be deleted by a standby's beat; ReadInstances'
// callers judge the leader by the progress row, not by this table.
//
// It touches no other table (a stopped leader's transaction may hold the
// progress row for as long as it is stopped) and the relay treats a
// failure as harmless: the table is for operators only.
func (s *Store) BeatInstance(ctx context.Context, role string) error {
	switch role {
	case RoleLeader, RoleStandby:
	default:
		return fmt.Errorf("record instance %q of relay %q: role %q: want %q or %q",
			s.cfg.Instance, s.cfg.RelayName, role, RoleLeader, RoleStandby)
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO outbox_relay_instances
		(relay_name, instance, role, started_at, heartbeat) VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
		ON DUPLICATE KEY UPDATE role = ?, heartbeat = UTC_TIMESTAMP(6)`,
		s.cfg.RelayName, s.cfg.Instance, role, role); err != nil {
		return fmt.Errorf("record instance %q of relay %q as %s: %w", s.cfg.Instance, s.cfg.RelayName, role, err)
	}
	s.mu.Lock()
	prune := s.pruned.IsZero() || time.Since(s.pruned) >= pruneEvery
	s.mu.Unlock()
	if !prune {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, fmt.Sprintf(`DELETE FROM outbox_relay_instances
		WHERE relay_name = ? AND heartbeat < UTC_TIMESTAMP(6) - INTERVAL %d SECOND`, int64(InstanceRetention/time.Second)),
		s.cfg.RelayName); err != nil {
		return fmt.Errorf("delete instances of relay %q without a heartbeat for %v: %w", s.cfg.RelayName, InstanceRetention, err)
	}
	s.mu.Lock()
	s.pruned = time.Now()
	s.mu.Unlock()
	return nil
}

// pruneEvery is how often BeatInstance deletes the rows of processes that
// died long ago: a tenth of InstanceRetention.
const pruneEvery = InstanceRetention / 10

// RemoveInstance deletes this process's row of outbox_relay_instances: a
// clean stop, after which `status` no longer lists it. Deleting a row that
// is not there is no error.
func (s *Store) RemoveInstance(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, "DELETE FROM outbox_relay_instances WHERE relay_name = ? AND instance = ?",
		s.cfg.RelayName, s.cfg.Instance); err != nil {
		return fmt.Errorf("remove instance %q of relay %q: %w", s.cfg.Instance, s.cfg.RelayName, err)
	}
	return nil
}

// InstanceState is one row of outbox_relay_instances as operators see it.
type InstanceState struct {
	RelayName string
	Instance  string    // host:pid unless the relay was given another name
	Role      string    // RoleLeader or RoleStandby: what it was at its last beat
	StartedAt time.Time // its first beat (UTC)
	// HeartbeatAgeSeconds is how old its last beat is, by the server's
	// clock; never negative.
	HeartbeatAgeSeconds float64
	// Alive: the heartbeat is within the lease. A standby beats at least
	// every 4/5 of the lease, so one that is not alive has died or hangs. (A
	// leader's row is written once per term: judge a leader by the progress
	// row instead.)
	Alive bool
}

// ReadInstances reads the rows of outbox_relay_instances: every relay
// name's when relayName is "", else that one's (none is no error), ordered
// by relay name, start and instance. lease is the relays' --leader-lease,
// against which Alive is judged. Ages are computed by the server against
// UTC_TIMESTAMP(6), as ReadStatus does. It changes nothing.
func ReadInstances(ctx context.Context, db *sql.DB, relayName string, lease time.Duration) ([]InstanceState, error) {
	q := `SELECT relay_name, instance, role, started_at, TIMESTAMPDIFF(MICROSECOND, heartbeat, UTC_TIMESTAMP(6))
		FROM outbox_relay_instances`
	var args []any
	if relayName != "" {
		q += " WHERE relay_name = ?"
		args = append(args, relayName)
	}
	rows, err := db.QueryContext(ctx, q+" ORDER BY relay_name, started_at, instance", args...)
	if err != nil {
		return nil, fmt.Errorf("read relay instances: %w", err)
	}
	defer rows.Close()
	var list []InstanceState
	for rows.Next() {
		var (
			i       InstanceState
			started sql.NullString
			ageUS   sql.NullInt64
		)
		if err := rows.Scan(&i.RelayName, &i.Instance, &i.Role, &started, &ageUS); err != nil {
			return nil, fmt.Errorf("read relay instances: %w", err)
		}
		i.StartedAt = parseTime(started)
		i.HeartbeatAgeSeconds = max(float64(ageUS.Int64)/1e6, 0)
		i.Alive = ageUS.Valid && i.HeartbeatAgeSeconds <= lease.Seconds()
		list = append(list, i)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read relay instances: %w", err)
	}
	return list, nil
}
