package checkpoint

import (
	"context"
	"fmt"
	"time"
)

// SetBroker records the RabbitMQ node the leader of epoch publishes to
// (node "" clears it: not connected, paused, or the term ended) and, when
// stalledFor > 0, that the broker has not confirmed for that long (the
// column holds now minus stalledFor, by the server's clock); stalledFor 0
// clears the stall. Fenced like SetMode: ErrFenced when another leader's
// epoch holds the row. One statement; the caller writes only on a change.
func (s *Store) SetBroker(ctx context.Context, epoch int64, node string, stalledFor time.Duration) error {
	var stalledUS any
	if stalledFor > 0 && node != "" {
		stalledUS = stalledFor.Microseconds()
	}
	if err := s.fencedUpdate(ctx, epoch, `UPDATE outbox_relay_progress SET broker = ?,
		confirms_stalled_at = UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND WHERE relay_name = ? AND epoch = ?`,
		nullIfEmpty(truncate(node, 255)), stalledUS, s.cfg.RelayName, epoch); err != nil {
		return fmt.Errorf("record RabbitMQ node %q of relay %q: %w", node, s.cfg.RelayName, err)
	}
	return nil
}
