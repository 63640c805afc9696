package relay

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// beatTimeout bounds one write of this process's row of
// outbox_relay_instances, and its removal at shutdown.
const beatTimeout = 2 * time.Second

// instanceRow keeps this process's row of outbox_relay_instances, which
// `status` reads to list the standbys. It is for operators only: a failed
// write is logged (WARN for the first failure after a success, then DEBUG,
// so a standby looking every second does not flood the log) and never
// stops the relay.
type instanceRow struct {
	r       *Relay
	failing bool
}

// beat records this process with role (leadership.RoleLeader or
// RoleStandby) and a fresh heartbeat.
func (b *instanceRow) beat(ctx context.Context, role string) {
	bctx, cancel := context.WithTimeout(ctx, beatTimeout)
	err := b.r.elector.BeatInstance(bctx, role)
	cancel()
	switch {
	case err == nil:
		if b.failing {
			b.r.log.Info("recording this instance in outbox_relay_instances works again", zap.String("role", role))
		}
		b.failing = false
	case ctx.Err() != nil:
		// Shutting down: the row is removed next.
	case b.failing:
		b.r.log.Debug("cannot record this instance for status", zap.String("role", role), zap.Error(err))
	default:
		b.failing = true
		b.r.log.Warn("cannot record this instance for status; relaying goes on, status may not list it",
			zap.String("role", role), zap.Error(err))
	}
}

// remove deletes this process's row at a clean stop, even though ctx has
// ended (shutdown): status then no longer lists it. A process that dies
// without it stays listed, not alive, until the row's cleanup.
func (b *instanceRow) remove(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), beatTimeout)
	defer cancel()
	if err := b.r.elector.RemoveInstance(rctx); err != nil {
		b.r.log.Debug("cannot remove this instance from outbox_relay_instances", zap.Error(err))
	}
}
