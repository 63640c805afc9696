package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// LostGTIDsError is a lossy failover: the server the relay is about to resume
// on lacks transactions the relay already published (docs/operations.md). Retrying
// cannot bring them back, and polling would hide the loss, so it is fatal in
// every mode (the CLI exits 2) unless Config.AcceptLostGTIDs is set.
type LostGTIDsError struct {
	Server     string            // host:port of the server
	Checkpoint position.Position // what the relay had published
	From       string            // where Checkpoint comes from (this process, the state file, the file then this process, the progress row)
	Executed   string            // the server's @@gtid_binlog_state / @@gtid_executed
	Missing    string            // the part of Checkpoint the server lacks (position.Missing)
	// Transactions are the GTIDs of the transactions the process remembers
	// sending messages of (its latest, up to recentLimit message ids) that
	// the server lacks; Sent is how many of their messages were handed to
	// the broker, confirmed or not, and MessageIDs those messages' ids
	// (possibly fewer: a transaction keeps its first recentLimit).
	Transactions []string
	Sent         int
	MessageIDs   []outbox.MessageID
}

// lostIDsShown bounds the message ids LostGTIDsError's message lists; the
// log line of the refusal lists them all.
const lostIDsShown = 50

func (e *LostGTIDsError) Error() string {
	known := "none of their messages is still known to this process"
	if e.Sent > 0 {
		ids := make([]string, min(len(e.MessageIDs), lostIDsShown))
		for i := range ids {
			ids[i] = e.MessageIDs[i].String()
		}
		known = fmt.Sprintf("%d messages of transaction(s) %s were sent to the broker (confirmed or not); their message ids: %s",
			e.Sent, strings.Join(e.Transactions, ", "), strings.Join(ids, ", "))
		if n := len(e.MessageIDs); n > lostIDsShown {
			known += fmt.Sprintf(", … (the log line \"lossy failover\" lists all %d known)", n)
		}
	}
	return fmt.Sprintf("lossy failover: server %s lacks transactions this relay already published: %s "+
		"(relay checkpoint %s, %s; server has %q); %s. Consumers may hold those messages, "+
		"but their rows and every other write of their transactions are gone from this server. "+
		"Check the old primary for them, then rerun with Config.AcceptLostGTIDs to resume from this server's own position",
		e.Server, e.Missing, e.Checkpoint, e.From, e.Executed, known)
}

// failoverCheck is the lossy-failover bookkeeping of one process
// (docs/operations.md, "Failover"): what it has published (publishedLog),
// kept across reconnects and leader terms and, with Config.StateFile,
// across restarts (stateFile), and the check that compares it with every
// server the relay resumes on. The lanes record each message before its
// publish (sent), the acker each acknowledged position (acked), and the
// pipeline's state-file goroutine writes the file as that moves (follow,
// save), apart from both; a term checks before it starts anything that
// publishes (checkNotLost, from checkTerm and runPoll) and the binlog
// stream after each reconnect (checkReconnect).
//
// sent, acked and the checks are safe for concurrent use; save is called
// by one goroutine at a time (follow, or the term after its pipeline).
type failoverCheck struct {
	log    *zap.Logger
	server gtidServer
	accept bool       // Config.AcceptLostGTIDs
	state  *stateFile // nil without Config.StateFile

	published    publishedLog
	stateFailing bool // the last write of the state file failed (logged once)
}

// gtidServer is the server the relay resumes on, as the check sees it.
type gtidServer interface {
	// Addr is its host:port, for the refusal.
	Addr() string
	// Flavor is "mysql" or "mariadb".
	Flavor(ctx context.Context) (string, error)
	// ExecutedGTIDs is its @@gtid_binlog_state (MariaDB) or
	// @@gtid_executed (MySQL).
	ExecutedGTIDs(ctx context.Context, flavor string) (string, error)
}

// dbServer is the gtidServer behind the relay's pool.
type dbServer struct {
	db   *sql.DB
	addr func() string
}

func (s dbServer) Addr() string { return s.addr() }
func (s dbServer) Flavor(ctx context.Context) (string, error) {
	return canal.DetectFlavor(ctx, s.db)
}
func (s dbServer) ExecutedGTIDs(ctx context.Context, flavor string) (string, error) {
	return canal.ExecutedGTIDs(ctx, s.db, flavor)
}

// sent records that rec's message is about to be handed to the broker.
func (f *failoverCheck) sent(rec *outbox.Record) { f.published.sent(rec) }

// acked folds an acknowledged position into what was published.
func (f *failoverCheck) acked(p position.Position) {
	if err := f.published.acked(p); err != nil {
		f.log.Warn("acknowledged position not recorded for the failover check", zap.Error(err))
	}
}

// startTerm fixes the flavor of the GTIDs a term reads.
func (f *failoverCheck) startTerm(flavor string) { f.published.startTerm(flavor) }

// follow keeps Config.StateFile up with the published position until stop
// closes: each time the position moves (a transaction's first message is
// about to be sent, or a position is acknowledged) it writes the file
// (save), at most once per ackGap. It needs neither the database nor the
// acker, so a slow or hanging acknowledgement does not hold the file back:
// a process killed at any time leaves a file that lacks at most the
// transactions whose first message went out in the last ackGap. Without a
// state file it returns at once.
func (f *failoverCheck) follow(stop <-chan struct{}) {
	if f.state == nil {
		return
	}
	moved := f.published.moved()
	gap := time.NewTimer(ackGap) // armed after each write
	gap.Stop()
	defer gap.Stop()
	for {
		select {
		case <-stop:
			return
		case <-moved:
		}
		f.save()
		gap.Reset(ackGap)
		select {
		case <-stop:
			return
		case <-gap.C:
		}
	}
}

// save writes the newest published position to Config.StateFile when it
// moved since the last write: from follow, and at the end of each binlog
// mode run (Relay.runMode).
func (f *failoverCheck) save() {
	if f.state == nil {
		return
	}
	p, ok, err := f.published.take()
	if err == nil && !ok {
		return
	}
	if err == nil {
		err = f.state.store(p)
	}
	if err != nil {
		if !f.stateFailing {
			f.log.Error("cannot write the state file; a restarted process will check a failover against the progress row only",
				zap.Error(err))
		}
		f.stateFailing = true
		return
	}
	if f.stateFailing {
		f.log.Info("writing the state file works again", zap.String("state_file", f.state.path))
	}
	f.stateFailing = false
}

// load starts the process from Config.StateFile's position, if any:
// the lossy-failover check then compares each server with it. A state file
// that cannot be read or written is a *ConfigError.
func (f *failoverCheck) load() error {
	if f.state == nil {
		return nil
	}
	if err := f.state.check(); err != nil {
		return &ConfigError{err}
	}
	p, err := f.state.load()
	if err != nil {
		return &ConfigError{err}
	}
	if p.GTIDSet == "" {
		return nil
	}
	if err := f.published.load(p, "read from Config.StateFile "+f.state.path); err != nil {
		return &ConfigError{fmt.Errorf("Config.StateFile %s: %w", f.state.path, err)}
	}
	f.log.Info("state file read: every server this relay resumes on must hold this position", zap.String("state_file", f.state.path),
		zap.Stringer("published", p))
	return nil
}

// checkNotLost is run before a term (each mode of it) starts anything that
// publishes: the server's executed GTID set must contain the newest
// position this process published, or the stored one when the process has
// published none (a process started fresh knows only the row, which after
// a failover is the replicated one). It returns a *LostGTIDsError when it
// does not; with AcceptLostGTIDs it logs what is skipped and reports lost =
// true instead: the caller then starts from the server's own position.
func (f *failoverCheck) checkNotLost(ctx context.Context, stored position.Position) (lost bool, err error) {
	lostErr, err := f.lossOn(ctx, stored)
	if err != nil || lostErr == nil {
		return false, err
	}
	ids := make([]string, len(lostErr.MessageIDs))
	for i, id := range lostErr.MessageIDs {
		ids[i] = id.String()
	}
	fields := []zap.Field{zap.String("missing", lostErr.Missing), zap.String("checkpoint", lostErr.Checkpoint.String()),
		zap.String("server_executed", lostErr.Executed), zap.Strings("transactions", lostErr.Transactions),
		zap.Int("messages_sent", lostErr.Sent), zap.Strings("message_ids", ids)}
	if !f.accept {
		f.log.Error("lossy failover", fields...)
		return false, lostErr
	}
	f.log.Warn("Config.AcceptLostGTIDs: resuming from the server's own position; the transactions this server lacks are skipped", fields...)
	// From now on the server's history is the reference: forget the old
	// position so the next (re)connection compares with what this term stores.
	f.published.reset()
	if f.state != nil {
		// Its position is the old server's: until this term acknowledges
		// something, a restart compares with the progress row instead.
		if err := os.Remove(f.state.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			f.log.Warn("cannot remove the state file after accepting lost GTIDs", zap.Error(err))
		}
	}
	return true, nil
}

// lossOn compares the server with the newest published position (or the
// stored one when the process knows of none): a *LostGTIDsError when the
// server lacks part of it, nil when it has it all or there are no GTIDs to
// compare.
func (f *failoverCheck) lossOn(ctx context.Context, stored position.Position) (*LostGTIDsError, error) {
	cp, from, err := f.published.newest()
	if err != nil {
		return nil, err
	}
	if cp.GTIDSet == "" {
		cp, from = stored, "the stored progress row (this process has published nothing yet)"
	}
	if cp.GTIDSet == "" {
		return nil, nil // file+pos or nothing yet: no GTIDs to compare
	}
	if cp.Flavor == "" {
		if cp.Flavor, err = f.server.Flavor(ctx); err != nil {
			return nil, fmt.Errorf("check the checkpoint against the server: %w", err)
		}
	}
	executed, err := f.server.ExecutedGTIDs(ctx, cp.Flavor)
	if err != nil {
		return nil, err
	}
	missing, err := position.Missing(cp.Flavor, executed, cp)
	if err != nil {
		return nil, fmt.Errorf("compare checkpoint %s with the server's executed GTIDs: %w", cp, err)
	}
	if missing == "" {
		return nil, nil
	}
	if src := f.published.loadedLacking(executed); src != "" && src != from {
		from = src + ", then " + from // what the server lacks came from the file too
	}
	lostErr := &LostGTIDsError{Server: f.server.Addr(), Checkpoint: cp, From: from,
		Executed: executed, Missing: missing}
	lostErr.Sent, lostErr.MessageIDs, lostErr.Transactions = f.published.lostOn(executed)
	return lostErr, nil
}

// checkReconnect is the tailer's CheckServer: a reconnected stream may have
// reached another server (a VIP moved by a failover). A lossy one stops the
// stream; with AcceptLostGTIDs it ends the term instead, so the next one
// resumes from the server's own position (checkNotLost).
func (f *failoverCheck) checkReconnect(ctx context.Context) error {
	lostErr, err := f.lossOn(ctx, position.Position{})
	switch {
	case err != nil:
		return err // retried with the connection
	case lostErr == nil:
		return nil
	case f.accept:
		return &canal.StopError{Err: fmt.Errorf("the binlog stream reconnected to a server that lacks published transactions (%s); "+
			"restarting the term to resume from its own position (Config.AcceptLostGTIDs)", lostErr.Missing)}
	}
	f.log.Error("lossy failover", zap.String("missing", lostErr.Missing), zap.String("checkpoint", lostErr.Checkpoint.String()),
		zap.String("server_executed", lostErr.Executed), zap.Strings("transactions", lostErr.Transactions),
		zap.Int("messages_sent", lostErr.Sent))
	return &canal.StopError{Err: lostErr}
}
