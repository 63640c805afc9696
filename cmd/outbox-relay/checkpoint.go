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
		usage:   "show | set --gtid SET | set --file F --pos N | set --from-relay NAME [--force] [flags]",
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

set --from-relay NAME moves a deployment to a new relay name: it copies
NAME's checkpoint and mode into --relay-name's row (created if missing), so
the new name resumes exactly where a new leader of NAME would: nothing lost,
nothing repeated beyond what NAME published and did not acknowledge. Stop
every instance of NAME first: it is refused (exit 2) while NAME has a live
leader, unless --force, and when NAME's row records another outbox table
than --table. Then start the relays with the new name (docs/operations.md,
"Renaming a relay").

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
	from := fs.String("from-relay", "", "set: copy the checkpoint and mode of this relay `name` (stopped) to --relay-name: a renamed deployment resumes where it stopped")
	force := new(bool)
	declareOverride(fs, force, "force", "set: even while a live leader delivers (its next acknowledgement overwrites the value)")
	return func(ctx context.Context, inv *invocation) error {
		if err := checkpointArgs(inv, r); err != nil {
			return err
		}
		want := position.Position{GTIDSet: *gtid, File: *file, Pos: uint32(*pos)}
		given := 0
		for _, v := range []string{*gtid, *file, *from} {
			if v != "" {
				given++
			}
		}
		switch {
		case given != 1:
			return usagef("checkpoint set: give --gtid SET, --file F --pos N or --from-relay NAME")
		case *from != "" && inv.typed["pos"]:
			return usagef("checkpoint set: --pos goes with --file, not --from-relay")
		case *from == r.relayName:
			return usagef("checkpoint set: --from-relay %q is --relay-name itself: name the relay whose checkpoint to copy", *from)
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
		if *from != "" {
			return copyCheckpoint(ctx, db, inv, r, *from, *force)
		}
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
	if err := mayChange(cur, force); err != nil {
		return err
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
	return printSet(inv.stdout, r.json, cur, next, nil)
}

// mayChange refuses (exit 2) to change the checkpoint of a relay a live
// leader delivers for, unless force: it must be stopped, or paused with
// its leader stopped.
func mayChange(cur operator.RelayStatus, force bool) error {
	switch {
	case force || !cur.Live():
	case cur.Paused == nil:
		return usagef("checkpoint set: relay %q is %s and led by %s (heartbeat %.1fs ago): run 'outbox-relay pause' (or stop the relay) first, or give --force",
			cur.RelayName, cur.Status, cur.Leader.Instance, cur.Leader.HeartbeatAgeSeconds)
	case !cur.Paused.Stopped:
		return usagef("checkpoint set: relay %q is PAUSED but its leader %s has not stopped yet (it finishes in-flight messages first): wait until 'outbox-relay status' shows it stopped, or give --force",
			cur.RelayName, cur.Leader.Instance)
	}
	return nil
}

// copyCheckpoint is `checkpoint set --from-relay`: it copies the
// checkpoint and mode of relay from (stopped, on --table) to --relay-name's
// row, creating that row when the name never ran. Whether from still leads
// is judged by the lease its leader recorded, not --leader-lease: the old
// deployment may run with another lease than this command is given.
func copyCheckpoint(ctx context.Context, db *sql.DB, inv *invocation, r *readFlags, from string, force bool) error {
	src, err := operator.ReadStatus(ctx, db, from, r.lease)
	if err != nil {
		return unknownRelay(err)
	}
	old := src[0]
	switch {
	case old.LiveByOwnLease() && !force:
		return usagef("checkpoint set: relay %q still leads (%s, heartbeat %.1fs ago): stop every instance of it first (its checkpoint moves while it delivers, and the relay name taking over is refused while it leads the table), or give --force",
			old.RelayName, old.Leader.Instance, old.Leader.HeartbeatAgeSeconds)
	case old.Table != "" && old.Table != r.table:
		return usagef("checkpoint set: relay %q publishes outbox table %q, not --table %q: its checkpoint is no place to start %q from; give --table %s if that is the table",
			old.RelayName, old.Table, r.table, r.table, old.Table)
	}
	if err := checkpoint.EnsureRow(ctx, db, r.relayName); err != nil {
		return fmt.Errorf("checkpoint set: %w", err)
	}
	rows, err := operator.ReadStatus(ctx, db, r.relayName, r.lease)
	if err != nil {
		return err
	}
	cur := rows[0]
	if err := mayChange(cur, force); err != nil {
		return err
	}
	reason := fmt.Sprintf("%s at %s from %s to %s, copied from relay %s (mode %s)", checkpoint.SetByOperator,
		time.Now().UTC().Format(time.RFC3339), cur.Position, old.Position, old.RelayName, old.Mode)
	if err := operator.SetProgress(ctx, db, cur.RelayName, cur.Epoch, old.Position, old.Mode, reason); errors.Is(err, checkpoint.ErrFenced) {
		return fmt.Errorf("checkpoint set: relay %q got a new leader meanwhile; nothing changed: check and run again", cur.RelayName)
	} else if err != nil {
		return err
	}
	inv.log.Info("checkpoint set", zap.String("relay_name", cur.RelayName), zap.String("from_relay", old.RelayName),
		zap.Stringer("old", cur.Position), zap.Stringer("new", old.Position), zap.String("mode", old.Mode),
		zap.Int64("epoch", cur.Epoch), zap.Bool("force", force))
	next := cur
	next.Position, next.Mode = old.Position, old.Mode
	return printSet(inv.stdout, r.json, cur, next, &old.RelayName)
}

// printSet prints what checkpoint set changed: the old and new checkpoint
// (and mode) of relay cur, and the relay it was copied from (nil for none).
func printSet(w io.Writer, asJSON bool, cur, next operator.RelayStatus, from *string) error {
	j := map[string]any{"relay_name": cur.RelayName, "old": checkpointOf(cur), "new": checkpointOf(next), "mode": next.Mode}
	if from != nil {
		j["from_relay"] = *from
	}
	return render(w, asJSON, j, func(w io.Writer) error {
		copied := ""
		if from != nil {
			copied = ", copied from relay " + *from
		}
		_, err := fmt.Fprintf(w, "relay %s: checkpoint was %s\nrelay %s: checkpoint is  %s (mode %s%s)\n",
			cur.RelayName, checkpointText(checkpointOf(cur)), cur.RelayName, checkpointText(checkpointOf(next)), next.Mode, copied)
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
