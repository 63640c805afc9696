package leadership

import (
	"context"
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
// Elector, so that a standby's look costs one statement here.
//
// Only a standby beats on every look for leadership; a leader beats once
// when its term starts, as its liveness is leader_heartbeat in the progress
// row. So the row of a leader whose term lasts longer than
// InstanceRetention may be deleted by a standby's beat; operator.ReadInstances'
// callers judge the leader by the progress row, not by this table.
//
// It touches no other table (a stopped leader's transaction may hold the
// progress row for as long as it is stopped) and the relay treats a
// failure as harmless: the table is for operators only.
func (s *Elector) BeatInstance(ctx context.Context, role string) error {
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
func (s *Elector) RemoveInstance(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, "DELETE FROM outbox_relay_instances WHERE relay_name = ? AND instance = ?",
		s.cfg.RelayName, s.cfg.Instance); err != nil {
		return fmt.Errorf("remove instance %q of relay %q: %w", s.cfg.Instance, s.cfg.RelayName, err)
	}
	return nil
}
