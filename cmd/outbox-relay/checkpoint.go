package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
	"github.com/outbox-relay/outbox-relay/position"
)

func init() {
	register(&command{
		name:    "checkpoint",
		summary: "show or set a relay's checkpoint (its binlog position)",
		usage:   "show | set --gtid SET | set --file F --pos N [--force] [flags]",
		help: `show prints the checkpoint of --relay-name's progress row with its status,
mode, epoch and leader.

set writes a new checkpoint. It is refused (exit 2) while a live leader
delivers, unless --force: pause the relay first ('outbox-relay pause' waits
until the leader has stopped) or stop it. A live leader is one the row names
whose heartbeat is within --leader-lease (give run's value). It is refused
(exit 2) when the server no longer has the position (purged) or never had
it. It prints the old and new positions and stores both, and the next leader
term (or the paused leader, at 'resume') logs them. It sets mode binlog, so
the leader tails the binlog from exactly this position (a stored poll mode
would make it take the server's current position instead): rows inserted
after the position are published, again if they were already; rows before
it that are still pending are not read from the binlog. It never changes
the epoch. With --force against a leader that is delivering, its next
acknowledgement overwrites the new value.

Exit codes: 0 done, 1 a database failure, 2 bad usage, an unknown relay name
or a refused request.`,
		subs:  []*subcommand{{"show", setupCheckpointShow}, {"set", setupCheckpointSet}},
		noSub: "checkpoint: give one subcommand: show or set",
	})
}

// declareCheckpoint declares the flags of both checkpoint sub-commands.
func declareCheckpoint(fs *flag.FlagSet) *readFlags {
	return declareRead(fs, "the relay `name` whose checkpoint to show or set", "default")
}

// checkpointArgs checks what show and set have in common: no arguments but
// the sub-command, a relay name.
func checkpointArgs(inv *invocation, r *readFlags) error {
	if len(inv.args) != 0 {
		return usagef("checkpoint: give one subcommand: show or set")
	}
	if r.relayName == "" {
		return usagef("checkpoint: --relay-name is empty")
	}
	return nil
}

func setupCheckpointShow(fs *flag.FlagSet) runFunc {
	r := declareCheckpoint(fs)
	return func(ctx context.Context, inv *invocation) error {
		if err := checkpointArgs(inv, r); err != nil {
			return err
		}
		db, err := r.open(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		rows, err := operator.ReadStatus(ctx, db, r.relayName, r.lease)
		if err != nil {
			return unknownRelay(err)
		}
		return printCheckpoint(inv.stdout, r.json, rows[0])
	}
}

func setupCheckpointSet(fs *flag.FlagSet) runFunc {
	r := declareCheckpoint(fs)
	gtid := fs.String("gtid", "", "set: the new checkpoint as a GTID `set` (the server's syntax)")
	file := fs.String("file", "", "set: the new checkpoint's binlog `file` (servers without GTIDs); with --pos")
	pos := fs.Uint("pos", 0, "set: the offset in --file")
	force := new(bool)
	declareOverride(fs, force, "force", "set: even while a live leader delivers (its next acknowledgement overwrites the value)")
	return func(ctx context.Context, inv *invocation) error {
		if err := checkpointArgs(inv, r); err != nil {
			return err
		}
		want := position.Position{GTIDSet: *gtid, File: *file, Pos: uint32(*pos)}
		switch {
		case (*gtid != "") == (*file != ""):
			return usagef("checkpoint set: give --gtid SET or --file F --pos N")
		case *file != "" && !inv.typed["pos"]:
			return usagef("checkpoint set: --file needs --pos")
		case *gtid != "" && inv.typed["pos"]:
			return usagef("checkpoint set: --pos goes with --file, not --gtid")
		case *pos > 1<<32-1:
			return usagef("checkpoint set: --pos %d is too large", *pos)
		}
		db, err := r.open(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		return setCheckpoint(ctx, db, inv, r, want, *force)
	}
}

// setCheckpoint checks that the relay may be changed and the server has
// want, then writes it.
func setCheckpoint(ctx context.Context, db *sql.DB, inv *invocation, r *readFlags, want position.Position, force bool) error {
	rows, err := operator.ReadStatus(ctx, db, r.relayName, r.lease)
	if err != nil {
		return unknownRelay(err)
	}
	cur := rows[0]
	switch {
	case force || !cur.Live():
	case cur.Paused == nil:
		return usagef("checkpoint set: relay %q is %s and led by %s (heartbeat %.1fs ago): run 'outbox-relay pause' (or stop the relay) first, or give --force",
			cur.RelayName, cur.Status, cur.Leader.Instance, cur.Leader.HeartbeatAgeSeconds)
	case !cur.Paused.Stopped:
		return usagef("checkpoint set: relay %q is PAUSED but its leader %s has not stopped yet (it finishes in-flight messages first): wait until 'outbox-relay status' shows it stopped, or give --force",
			cur.RelayName, cur.Leader.Instance)
	}
	flavor, err := canal.DetectFlavor(ctx, db)
	if err != nil {
		return fmt.Errorf("checkpoint set: %w", err)
	}
	want.Flavor = flavor
	if want.GTIDSet != "" {
		if _, err := position.ParseGTIDSet(flavor, want.GTIDSet); err != nil {
			return usagef("checkpoint set: --gtid: %v", err)
		}
	}
	var purged *canal.PurgedError
	if err := canal.CheckPosition(ctx, db, want); errors.As(err, &purged) {
		return usagef("checkpoint set: refused: %s is not on the server: %s", want, purged.Detail)
	} else if err != nil {
		return fmt.Errorf("checkpoint set: %w", err)
	}
	reason := fmt.Sprintf("%s at %s from %s to %s", checkpoint.SetByOperator, time.Now().UTC().Format(time.RFC3339), cur.Position, want)
	if err := operator.SetPosition(ctx, db, cur.RelayName, cur.Epoch, want, reason); errors.Is(err, checkpoint.ErrFenced) {
		return fmt.Errorf("checkpoint set: relay %q got a new leader meanwhile; nothing changed: check and run again", cur.RelayName)
	} else if err != nil {
		return err
	}
	inv.log.Info("checkpoint set", zap.String("relay_name", cur.RelayName), zap.Stringer("old", cur.Position),
		zap.Stringer("new", want), zap.Int64("epoch", cur.Epoch), zap.Bool("force", force))
	next := cur
	next.Position, next.Mode = want, "binlog"
	j := map[string]any{"relay_name": cur.RelayName, "old": checkpointOf(cur), "new": checkpointOf(next)}
	return render(inv.stdout, r.json, j, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "relay %s: checkpoint was %s\nrelay %s: checkpoint is  %s (mode binlog)\n",
			cur.RelayName, checkpointText(checkpointOf(cur)), cur.RelayName, checkpointText(checkpointOf(next)))
		return err
	})
}

// checkpointShowJSON is `checkpoint show --json`.
type checkpointShowJSON struct {
	RelayName   string         `json:"relay_name"`
	Status      string         `json:"status"`
	Mode        string         `json:"mode"`
	ModeReason  *string        `json:"mode_reason"`
	Epoch       int64          `json:"epoch"`
	Leader      *leaderJSON    `json:"leader"`
	Checkpoint  checkpointJSON `json:"checkpoint"`
	LastEventAt *time.Time     `json:"last_event_at"`
	UpdatedAt   *time.Time     `json:"updated_at"`
}

func printCheckpoint(w io.Writer, asJSON bool, s operator.RelayStatus) error {
	j := checkpointShowJSON{RelayName: s.RelayName, Status: s.Status, Mode: s.Mode, ModeReason: orNull(flagNames(s.ModeReason)),
		Epoch: s.Epoch, Leader: leaderOf(s), Checkpoint: checkpointOf(s), LastEventAt: timeOrNull(s.LastEventAt),
		UpdatedAt: timeOrNull(s.UpdatedAt)}
	return render(w, asJSON, j, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "relay       %s\ncheckpoint  %s\nstatus      %s\nmode        %s%s\nepoch       %d\nleader      %s\nlast event  %s\n",
			j.RelayName, checkpointText(j.Checkpoint), j.Status, j.Mode, paren(j.ModeReason), j.Epoch, leaderText(j.Leader), timeText(j.LastEventAt))
		return err
	})
}
