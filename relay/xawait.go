package relay

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/internal/backoff"
)

// xaVisibleWithin bounds how long the handover after an XA COMMIT waits for
// the committed rows to become visible.
const xaVisibleWithin = 10 * time.Second

// waitXAVisible waits until the server no longer lists the XA transaction
// of err (a *canal.XACommitError) as prepared (XA RECOVER), at most
// xaVisibleWithin. A server writes an XA COMMIT issued from another session
// than the prepare's to the binlog before it commits in the engine: for a
// moment a snapshot position may hold the commit while its rows are not
// visible, and the handover's sweep would miss them. An XA RECOVER the
// server refuses, or a wait that runs out, is logged and the handover goes
// on.
func (r *Relay) waitXAVisible(ctx context.Context, err error) {
	var xa *canal.XACommitError
	if !errors.As(err, &xa) || r.db == nil {
		return
	}
	deadline := time.Now().Add(xaVisibleWithin)
	for n := 1; ; n++ {
		listed, qerr := r.xaListed(ctx, xa.XID)
		switch {
		case qerr != nil:
			r.log.Warn("XA RECOVER failed: the handover goes on without waiting for the XA transaction's rows to be visible",
				zap.String("xid", xa.XID), zap.Error(qerr))
			return
		case !listed:
			return
		case time.Now().After(deadline):
			r.log.Warn("the committed XA transaction is still listed as prepared; the handover goes on",
				zap.String("xid", xa.XID), zap.Duration("waited", xaVisibleWithin))
			return
		}
		if !backoff.Sleep(ctx, backoff.Delay(time.Millisecond, 100*time.Millisecond, n)) {
			return
		}
	}
}

// xaListed reports whether XA RECOVER lists xid (canal's form:
// x'gtrid',x'bqual',formatID).
func (r *Relay) xaListed(ctx context.Context, xid string) (bool, error) {
	rows, err := r.db.QueryContext(ctx, "XA RECOVER")
	if err != nil {
		return false, fmt.Errorf("list prepared XA transactions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var format, gl, bl int64
		var data []byte
		if err := rows.Scan(&format, &gl, &bl, &data); err != nil {
			return false, fmt.Errorf("list prepared XA transactions: %w", err)
		}
		if int(gl+bl) > len(data) || gl < 0 || bl < 0 {
			continue
		}
		got := fmt.Sprintf("x'%s',x'%s',%d", hex.EncodeToString(data[:gl]), hex.EncodeToString(data[gl:gl+bl]), format)
		if got == xid {
			return true, nil
		}
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("list prepared XA transactions: %w", err)
	}
	return false, nil
}
