package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
)

func init() {
	register(&command{
		name:    "pause",
		summary: "pause a relay: its leader stops reading and publishing, keeping leadership",
		help: `Sets --relay-name's status to PAUSED and wakes its leader, which stops within
a second: binlog mode stops reading at a transaction boundary, poll mode (and
the delivery of the rows pending at a start) after the rounds under way, and
everything already published is confirmed and acknowledged, so the stored
checkpoint is exactly where it stopped. Work under way that outlasts the
leader's --shutdown-timeout is cut: the leader logs at WARN how many messages
will be published again after resume. The leader keeps its lock and heartbeat
(no standby takes over) and reads nothing further until 'outbox-relay
resume'. A relay paused with no leader running starts paused.

pause waits until the leader has stopped (at most --wait) and prints the
checkpoint it stopped at; then 'checkpoint set' may move it. Waking the
leader kills the query its lock connection waits in (KILL QUERY): the
relay's own MySQL user may do that; as another user without the privilege
the leader still notices at its next heartbeat (--heartbeat-interval).

Exit codes: 0 paused (or already paused), 1 a database failure or a leader
that did not stop within --wait (the pause stays stored), 2 bad usage or an
unknown relay name.`,
		setup: func(fs *flag.FlagSet) runFunc { return setupPause(fs, true) },
	})
	register(&command{
		name:    "resume",
		summary: "resume a paused relay where it stopped",
		help: `Sets --relay-name's status to ACTIVE and wakes its leader, which continues
from the stored checkpoint (the one it stopped at, or the one 'checkpoint
set' wrote meanwhile): nothing is lost or repeated. Resuming a relay that is
not paused changes nothing.

Exit codes: 0 done, 1 a database failure, 2 bad usage or an unknown relay
name.`,
		setup: func(fs *flag.FlagSet) runFunc { return setupPause(fs, false) },
	})
}

func setupPause(fs *flag.FlagSet, pause bool) runFunc {
	name := "resume"
	if pause {
		name = "pause"
	}
	r := declareRead(fs, "the relay `name` to "+name, "default")
	wait := time.Duration(0)
	if pause {
		fs.DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the leader to stop; 0 does not wait")
	}
	return func(ctx context.Context, inv *invocation) error {
		if err := noArgs(inv, name); err != nil {
			return err
		}
		if r.relayName == "" {
			return usagef("%s: --relay-name is empty", name)
		}
		if wait < 0 {
			return usagef("pause: --wait %s: want 0 or more", wait)
		}
		db, err := r.open(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		set := operator.Resume
		if pause {
			set = operator.Pause
		}
		was, err := set(ctx, db, r.relayName)
		if err != nil {
			return unknownRelay(err)
		}
		woke, wakeErr := operator.Wake(ctx, db, r.relayName)
		if wakeErr != nil {
			inv.log.Warn("cannot wake the leader; it notices at its next heartbeat", zap.Error(wakeErr))
		}
		inv.log.Info(name, zap.String("relay_name", r.relayName), zap.String("was", was), zap.Bool("leader_woken", woke))
		if !pause {
			return printResumed(ctx, db, inv, r, was)
		}
		return awaitPaused(ctx, db, inv, r, was, wait)
	}
}

// pauseJSON is the output of pause and resume --json.
type pauseJSON struct {
	RelayName  string         `json:"relay_name"`
	Was        string         `json:"was"`
	Status     string         `json:"status"`
	Paused     *pausedJSON    `json:"paused"`
	Leader     *leaderJSON    `json:"leader"`
	Checkpoint checkpointJSON `json:"checkpoint"`
}

func pauseJSONOf(s operator.RelayStatus, was string) pauseJSON {
	return pauseJSON{RelayName: s.RelayName, Was: was, Status: s.Status, Paused: pausedOf(s), Leader: leaderOf(s), Checkpoint: checkpointOf(s)}
}

// awaitPaused waits until a live leader has stopped for the pause (or
// none runs, or wait has passed) and prints the state.
func awaitPaused(ctx context.Context, db *sql.DB, inv *invocation, r *readFlags, was string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		rows, err := operator.ReadStatus(ctx, db, r.relayName, r.lease)
		if err != nil {
			return err
		}
		s := rows[0]
		stopped := s.Paused != nil && s.Paused.Stopped
		if stopped || !s.Live() || time.Now().After(deadline) {
			j := pauseJSONOf(s, was)
			if r.json {
				if err := printJSON(inv.stdout, j); err != nil {
					return err
				}
			} else {
				switch {
				case stopped && s.Leader != nil:
					fmt.Fprintf(inv.stdout, "relay %s: paused; leader %s stopped at checkpoint %s\n", s.RelayName, s.Leader.Instance, checkpointText(j.Checkpoint))
				case !s.Live() && was == "":
					fmt.Fprintf(inv.stdout, "relay %s: paused; no relay has run with this name yet: the first one started with it starts paused\n", s.RelayName)
				case !s.Live(): // also a leader that stopped for the pause and then exited
					fmt.Fprintf(inv.stdout, "relay %s: paused; no leader is running: the next one starts paused (checkpoint %s)\n", s.RelayName, checkpointText(j.Checkpoint))
				}
			}
			if !stopped && s.Live() {
				return fmt.Errorf("relay %s: PAUSED is stored, but leader %s has not stopped within --wait %s (it finishes in-flight messages first); 'outbox-relay status' shows when it has",
					s.RelayName, s.Leader.Instance, wait)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func printResumed(ctx context.Context, db *sql.DB, inv *invocation, r *readFlags, was string) error {
	rows, err := operator.ReadStatus(ctx, db, r.relayName, r.lease)
	if err != nil {
		return err
	}
	s := rows[0]
	j := pauseJSONOf(s, was)
	if r.json {
		return printJSON(inv.stdout, j)
	}
	var err2 error
	switch {
	case was != checkpoint.StatusPaused:
		_, err2 = fmt.Fprintf(inv.stdout, "relay %s: was %s, not paused; nothing changed\n", s.RelayName, was)
	case s.Live():
		_, err2 = fmt.Fprintf(inv.stdout, "relay %s: resumed; leader %s continues from checkpoint %s\n", s.RelayName, s.Leader.Instance, checkpointText(j.Checkpoint))
	default:
		_, err2 = fmt.Fprintf(inv.stdout, "relay %s: resumed; no leader is running: the next one continues from checkpoint %s\n", s.RelayName, checkpointText(j.Checkpoint))
	}
	return err2
}
