package relay

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// LostGTIDsError is a lossy failover: the server the relay is about to resume
// on lacks transactions the relay already published (docs/operations.md). Retrying
// cannot bring them back, and polling would hide the loss, so it is fatal in
// binlog and auto mode alike (the CLI exits 2) unless Config.AcceptLostGTIDs
// is set. Poll mode reads no binlog and does not check.
type LostGTIDsError struct {
	Server     string            // host:port of the server
	Checkpoint position.Position // what the relay had published
	From       string            // where Checkpoint comes from (this process, the state file, the progress row)
	Executed   string            // the server's @@gtid_binlog_state / @@gtid_executed
	Missing    string            // the part of Checkpoint the server lacks (position.Missing)
	// MessageIDs are the messages of rows published in Missing that the
	// process still remembers (the last recentLimit acknowledged rows);
	// possibly not all of them.
	MessageIDs []outbox.MessageID
}

// lostIDsShown bounds the message ids LostGTIDsError's message lists; the
// log line of the refusal lists them all.
const lostIDsShown = 50

func (e *LostGTIDsError) Error() string {
	known := "none of their message ids is still known"
	if n := len(e.MessageIDs); n > 0 {
		ids := make([]string, min(n, lostIDsShown))
		for i := range ids {
			ids[i] = e.MessageIDs[i].String()
		}
		known = fmt.Sprintf("message ids of %d rows published from them: %s", n, strings.Join(ids, ", "))
		if n > lostIDsShown {
			known += fmt.Sprintf(", … (the log line \"lossy failover\" lists all %d)", n)
		}
	}
	return fmt.Sprintf("lossy failover: server %s lacks transactions this relay already published: %s "+
		"(relay checkpoint %s, %s; server has %q); %s. The messages of those transactions were delivered, "+
		"but their rows and every other write of theirs are gone from this server. "+
		"Check the old primary for them, then rerun with --accept-lost-gtids to resume from this server's own position",
		e.Server, e.Missing, e.Checkpoint, e.From, e.Executed, known)
}

// recentLimit bounds the rows whose message ids the relay keeps, with their
// transaction's GTIDs, to name what a lossy failover lost: 16 bytes a row.
const recentLimit = 4096

// recentTxn is one acknowledged transaction with rows.
type recentTxn struct {
	flavor string
	gtids  string // the transaction's own GTIDs (position.Added)
	mids   []outbox.MessageID
}

// noteResolved keeps the message ids of the latest acknowledged
// transactions, at most recentLimit rows, oldest dropped first.
func (r *Relay) noteResolved(txns []ordering.Resolved[position.Position]) {
	r.publishedMu.Lock()
	defer r.publishedMu.Unlock()
	for _, tx := range txns {
		prev := r.lastResolved
		r.lastResolved = tx.Pos
		if len(tx.MessageIDs) == 0 || tx.Pos.GTIDSet == "" || prev.GTIDSet != "" && prev.Flavor != tx.Pos.Flavor {
			continue
		}
		own, err := position.Added(tx.Pos.Flavor, prev.GTIDSet, tx.Pos.GTIDSet)
		if err != nil || own == "" {
			continue
		}
		mids := tx.MessageIDs
		if len(mids) > recentLimit {
			mids = mids[len(mids)-recentLimit:]
		}
		r.recent = append(r.recent, recentTxn{flavor: tx.Pos.Flavor, gtids: own, mids: mids})
		r.recentRows += len(mids)
		for r.recentRows > recentLimit {
			r.recentRows -= len(r.recent[0].mids)
			r.recent[0] = recentTxn{}
			r.recent = r.recent[1:]
		}
	}
}

// termStarts tells noteResolved where a term's reading starts: the first
// transaction it resolves follows from.
func (r *Relay) termStarts(from position.Position) {
	r.publishedMu.Lock()
	r.lastResolved = from
	r.publishedMu.Unlock()
}

// lostMessageIDs returns the message ids of the remembered transactions
// that a server whose executed GTIDs are executed lacks.
func (r *Relay) lostMessageIDs(executed string) []outbox.MessageID {
	r.publishedMu.Lock()
	defer r.publishedMu.Unlock()
	var out []outbox.MessageID
	for _, tx := range r.recent {
		if missing, err := position.Missing(tx.flavor, executed, position.Position{Flavor: tx.flavor, GTIDSet: tx.gtids}); err == nil && missing != "" {
			out = append(out, tx.mids...)
		}
	}
	return out
}

// notePublished records p, a position just acknowledged, as the newest this
// process has published. It survives reconnects and leader terms.
func (r *Relay) notePublished(p position.Position) {
	if p.GTIDSet == "" {
		return
	}
	r.publishedMu.Lock()
	defer r.publishedMu.Unlock()
	changed := r.published != p
	r.published = p
	r.publishedFrom = "published by this process"
	if r.state == nil || !changed {
		return
	}
	if err := r.state.store(p); err != nil {
		if !r.stateFailing {
			r.log.Error("cannot write the state file; a restarted process will check a failover against the progress row only",
				zap.Error(err))
		}
		r.stateFailing = true
		return
	}
	if r.stateFailing {
		r.log.Info("writing the state file works again", zap.String("state_file", r.state.path))
	}
	r.stateFailing = false
}

// loadState starts the process from Config.StateFile's position, if any:
// the lossy-failover check then compares each server with it. A state file
// that cannot be read or written is a *ConfigError.
func (r *Relay) loadState() error {
	if r.state == nil {
		return nil
	}
	if err := r.state.check(); err != nil {
		return &ConfigError{err}
	}
	p, err := r.state.load()
	if err != nil {
		return &ConfigError{err}
	}
	if p.GTIDSet == "" {
		return nil
	}
	r.publishedMu.Lock()
	r.published = p
	r.publishedFrom = "read from --state-file " + r.state.path
	r.publishedMu.Unlock()
	r.log.Info("state file read: every server this relay resumes on must hold this position", zap.String("state_file", r.state.path),
		zap.Stringer("published", p))
	return nil
}

func (r *Relay) newestPublished() position.Position {
	p, _ := r.newestPublishedFrom()
	return p
}

// newestPublishedFrom is newestPublished and where it came from.
func (r *Relay) newestPublishedFrom() (position.Position, string) {
	r.publishedMu.Lock()
	defer r.publishedMu.Unlock()
	return r.published, r.publishedFrom
}

// checkNotLost is run before a term reads the binlog: the server's executed
// GTID set must contain the newest position this process published, or the
// stored one when the process has published none (a process started fresh
// knows only the row, which after a failover is the replicated one). It
// returns a *LostGTIDsError when it does not; with AcceptLostGTIDs it logs
// what is skipped and reports lost = true instead: the caller then starts
// from the server's own position.
func (r *Relay) checkNotLost(ctx context.Context, stored position.Position) (lost bool, err error) {
	cp, from := r.newestPublishedFrom()
	if cp.GTIDSet == "" {
		cp, from = stored, "the stored progress row (this process has published nothing yet)"
	}
	if cp.GTIDSet == "" {
		return false, nil // file+pos or nothing yet: no GTIDs to compare
	}
	if cp.Flavor == "" {
		if cp.Flavor, err = canal.DetectFlavor(ctx, r.db); err != nil {
			return false, fmt.Errorf("check the checkpoint against the server: %w", err)
		}
	}
	executed, err := canal.ExecutedGTIDs(ctx, r.db, cp.Flavor)
	if err != nil {
		return false, err
	}
	missing, err := position.Missing(cp.Flavor, executed, cp)
	if err != nil {
		return false, fmt.Errorf("compare checkpoint %s with the server's executed GTIDs: %w", cp, err)
	}
	if missing == "" {
		return false, nil
	}
	lostErr := &LostGTIDsError{Server: r.canal.Host + ":" + fmt.Sprint(r.canal.Port), Checkpoint: cp, From: from, Executed: executed,
		Missing: missing, MessageIDs: r.lostMessageIDs(executed)}
	ids := make([]string, len(lostErr.MessageIDs))
	for i, id := range lostErr.MessageIDs {
		ids[i] = id.String()
	}
	if !r.cfg.AcceptLostGTIDs {
		r.log.Error("lossy failover", zap.String("missing", missing), zap.String("checkpoint", cp.String()),
			zap.String("server_executed", executed), zap.Strings("message_ids", ids))
		return false, lostErr
	}
	r.log.Warn("--accept-lost-gtids: resuming from the server's own position; the transactions this server lacks are skipped",
		zap.String("missing", missing), zap.String("checkpoint", cp.String()), zap.String("server_executed", executed),
		zap.Strings("message_ids", ids))
	// From now on the server's history is the reference: forget the old
	// position so the next (re)connection compares with what this term stores.
	r.publishedMu.Lock()
	r.published = position.Position{}
	r.recent, r.recentRows = nil, 0
	r.publishedMu.Unlock()
	if r.state != nil {
		// Its position is the old server's: until this term acknowledges
		// something, a restart compares with the progress row instead.
		if err := os.Remove(r.state.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("cannot remove the state file after accepting lost GTIDs", zap.Error(err))
		}
	}
	return true, nil
}
