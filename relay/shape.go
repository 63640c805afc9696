package relay

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/backoff"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// shapeRetryMax bounds the wait between two looks at the outbox table's
// columns while poll mode waits for them.
const shapeRetryMax = 5 * time.Second

// waitShape holds poll mode, before it publishes anything, while the
// relay's tables lack a column the relay reads or writes
// (migrations.Current: a column renamed away or dropped, by a migration
// tool or by hand): polling would fail on every round, and guessing would
// publish under wrong names. The wait is logged at WARN and recorded as the
// mode's reason (status) and the readiness reason, each time what is
// missing changes; it ends when the columns are back (nothing to do but
// the fix: the rows written meanwhile are in the table), ctx ends (then
// it returns nil) or leadership is lost. Another error (the database
// unreachable) ends it too.
func (r *Relay) waitShape(ctx context.Context, leader lease) error {
	var said string
	for n := 1; ; n++ {
		err := r.tablesShape(ctx)
		var schema *migrations.SchemaError
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			if said != "" {
				r.log.Info("the relay's tables have their columns again: polling")
				r.state.setNotReady("leading, not yet delivering")
			}
			return nil
		case !errors.As(err, &schema):
			return err
		}
		if msg := err.Error(); msg != said {
			said = msg
			reason := "poll mode waits for the relay's tables: " + msg
			if why, _ := r.modeReason.Load().(string); why != "" {
				reason += " (poll mode because: " + why + ")"
			}
			r.log.Warn(reason+"; the rows written meanwhile stay in the table and are delivered once the columns are back",
				zap.String("table", r.cfg.Table))
			r.state.setNotReady(reason)
			if err := r.progress.SetMode(ctx, leader.Epoch(), string(ModePoll), "mode poll: "+reason); err != nil && ctx.Err() == nil {
				return err
			}
		}
		t := time.NewTimer(backoff.Delay(r.cfg.PollInterval, shapeRetryMax, n))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-leader.Lost():
			t.Stop()
			return leader.Err()
		case <-t.C:
		}
	}
}

// shapeChanged reports an error of the poller that a changed table shape
// explains (a column it reads is gone): poll mode then waits for the
// columns (waitShape) instead of ending the term.
func shapeChanged(err error) bool { return unknownColumn(err) }
