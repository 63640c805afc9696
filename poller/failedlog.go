package poller

import (
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/publish"
)

// badRecordReason is the outbox_failed reason of a row that cannot be
// published as it is: the text the binlog relay stores for it, so the
// reason does not depend on the mode that met the row.
func badRecordReason(reason string) string {
	return (&publish.BadRecordError{Reason: reason}).Error()
}

// logFailed logs each row of a committed round that went to outbox_failed,
// naming its message id, with the message and fields the binlog relay logs
// for such a row.
func logFailed(log *zap.Logger, items []*item) {
	for _, it := range items {
		switch {
		case it.bad != "":
			log.Warn("row cannot be published, recording it in outbox_failed",
				zap.String("message_id", it.rec.MessageID.String()), zap.Uint64("id", it.rec.ID),
				zap.Error(&publish.BadRecordError{Reason: it.bad}))
		case it.res.Outcome != publish.Confirmed:
			log.Warn("message not delivered, recording it in outbox_failed",
				zap.String("message_id", it.rec.MessageID.String()), zap.Uint64("id", it.rec.ID),
				zap.String("reason", it.res.Reason))
		}
	}
}
