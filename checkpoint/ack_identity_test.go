package checkpoint_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// midsOf is the message ids of recs, in recs' order (idsOf's order).
func midsOf(recs []*outbox.Record) []outbox.MessageID {
	mids := make([]outbox.MessageID, len(recs))
	for i, r := range recs {
		mids[i] = r.MessageID
	}
	return mids
}

// messageIDsOf reads the message ids of the rows in rs, in rs' order.
func messageIDsOf(ctx context.Context, t *testing.T, db *sql.DB, rs []ordering.Range) []outbox.MessageID {
	t.Helper()
	var mids []outbox.MessageID
	for _, r := range rs {
		for id := r.Lo; id <= r.Hi; id++ {
			var mid outbox.MessageID
			var b []byte
			if err := db.QueryRowContext(ctx, "SELECT message_id FROM outbox WHERE id = ?", id).Scan(&b); err != nil {
				t.Fatalf("message id of row %d: %v", id, err)
			}
			copy(mid[:], b)
			mids = append(mids, mid)
		}
	}
	return mids
}

// After a lossy failover the new primary hands out AUTO_INCREMENT ids that
// were already published for other messages. An acknowledgement of an id
// for another message id (the old message) must leave the row that now has
// that id alone, in delete mode and in mark mode: it was never published.
// The rows it does name are acknowledged, and the position moves.
func TestAckLeavesRowWithReusedID(t *testing.T) {
	for _, mode := range []string{checkpoint.Delete, checkpoint.Mark} {
		t.Run(mode, func(t *testing.T) {
			ctx := testenv.Context(t, time.Minute)
			e := newAckEnv(ctx, t)
			store, err := checkpoint.New(e.pool, checkpoint.Config{OnDelivered: mode})
			if err != nil {
				t.Fatal(err)
			}
			recs := e.insert(ctx, t, 3, 10)
			mids := midsOf(recs)
			published := mids[1]
			published[0] ^= 0xff // the message the old primary's row 2 carried
			mids[1] = published
			pos := position.Position{Flavor: "mariadb", GTIDSet: "0-1-42"}
			if err := store.Ack(ctx, e.epoch, checkpoint.Ack{Pos: pos, HasPos: true, Mode: "binlog",
				IDs: idsOf(recs), MessageIDs: mids}); err != nil {
				t.Fatal(err)
			}
			pending := "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL"
			if n := e.count(ctx, t, pending); n != 1 {
				t.Fatalf("%d rows pending after the acknowledgement, want 1 (the row whose id was reused)", n)
			}
			if n := e.count(ctx, t, pending+" AND id = ? AND message_id = ?", recs[1].ID, recs[1].MessageID[:]); n != 1 {
				t.Fatalf("the row with the reused id %d was acknowledged for another message", recs[1].ID)
			}
			p, err := store.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if p.Position.GTIDSet != pos.GTIDSet {
				t.Fatalf("position %q, want %q", p.Position.GTIDSet, pos.GTIDSet)
			}
		})
	}
}
