package testload

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// MessageIDsAfter returns the message ids of the outbox rows that the
// binlog of the server c points at holds in transactions after from, up to
// the server's position when called: what a relay resuming from from reads
// again, and so the most it can publish twice. db is a pool on the same
// server; c needs a server id no other reader uses.
func MessageIDsAfter(ctx context.Context, db *sql.DB, c canal.Config, from position.Position) ([]outbox.MessageID, error) {
	until, err := canal.CurrentPosition(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("read the binlog position: %w", err)
	}
	if done, err := position.Reached(from, until); err != nil || done {
		return nil, err
	}
	tailer, err := canal.New(c)
	if err != nil {
		return nil, fmt.Errorf("read the binlog after %s: %w", from, err)
	}
	readCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	h := &idCollector{until: until, done: cancel}
	if err := tailer.Run(readCtx, from, h); err != nil && ctx.Err() == nil && !h.reached {
		return nil, fmt.Errorf("read the binlog after %s: %w", from, err)
	}
	return h.ids, ctx.Err()
}

// idCollector is a canal.Handler that keeps the message ids of the outbox
// rows it is given, until a transaction reaches until.
type idCollector struct {
	until   position.Position
	done    context.CancelFunc
	ids     []outbox.MessageID
	reached bool
}

func (h *idCollector) Row(_ context.Context, rec *outbox.Record) error {
	h.ids = append(h.ids, rec.MessageID)
	return nil
}

func (h *idCollector) Commit(_ context.Context, pos position.Position, _ int) error {
	if ok, err := position.Reached(pos, h.until); err != nil || ok {
		h.reached = true
		h.done()
		return err
	}
	return nil
}
