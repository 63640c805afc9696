package relay

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/outbox"
)

const sweepBatch = 1000

// sweep delivers every pending, due row, oldest first, through the lanes
// (so per-partition order holds), acknowledging each batch before reading
// the next, until none is left. The stored position does not move: stored is
// written back unchanged with each acknowledgement.
func (p *pipeline) sweep(ctx context.Context, stored canal.Position) (int, error) {
	total := 0
	for {
		recs, err := p.r.pendingRows(ctx, sweepBatch)
		if err != nil {
			return total, err
		}
		if len(recs) == 0 {
			return total, nil
		}
		for _, rec := range recs {
			if err := p.dispatch(ctx, rec); err != nil {
				return total, err
			}
		}
		p.tracker.Commit(stored)
		if err := p.tracker.WaitIdle(ctx); err != nil {
			return total, err
		}
		if err := p.flushAck(ctx, true); err != nil {
			return total, fmt.Errorf("acknowledge swept rows: %w", err)
		}
		total += len(recs)
	}
}

// pendingRows reads up to limit pending rows that are due, oldest first.
func (r *Relay) pendingRows(ctx context.Context, limit int) ([]*outbox.Record, error) {
	q := "SELECT id, message_id, partition_key, exchange, routing_key, message_type, headers, payload, " +
		"content_type, created_at, available_at FROM `" + r.cfg.Table + "` WHERE " +
		"(available_at IS NULL OR available_at <= NOW(6))"
	if r.cfg.OnDelivered == checkpoint.Mark {
		q += " AND delivered_at IS NULL"
	}
	q += " ORDER BY id LIMIT ?"
	rows, err := r.db.QueryContext(ctx, q, limit)
	if err != nil {
		return nil, fmt.Errorf("read pending rows of %s: %w", r.cfg.Table, err)
	}
	defer rows.Close()
	var out []*outbox.Record
	for rows.Next() {
		var (
			rec       outbox.Record
			messageID []byte
			headers   []byte
			available sql.NullTime
		)
		if err := rows.Scan(&rec.ID, &messageID, &rec.PartitionKey, &rec.Exchange, &rec.RoutingKey,
			&rec.MessageType, &headers, &rec.Payload, &rec.ContentType, &rec.CreatedAt, &available); err != nil {
			return nil, fmt.Errorf("read pending rows of %s: %w", r.cfg.Table, err)
		}
		copy(rec.MessageID[:], messageID)
		rec.Headers = headers
		if available.Valid {
			rec.AvailableAt = available.Time
		}
		out = append(out, &rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read pending rows of %s: %w", r.cfg.Table, err)
	}
	return out, nil
}
