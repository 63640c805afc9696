package operator

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// InstanceState is one row of outbox_relay_instances as operators see it.
type InstanceState struct {
	RelayName string
	Instance  string    // host:pid unless the relay was given another name
	Role      string    // leadership.RoleLeader or leadership.RoleStandby: what it was at its last beat
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
