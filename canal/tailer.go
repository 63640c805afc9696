package canal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/backoff"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// Handler receives the stream. Calls are sequential from Run's goroutine.
type Handler interface {
	// Row is called for each WRITE_ROWS row of the outbox table, in binlog
	// order, between two Commits. It may block (back-pressure: the tailer
	// stops reading). An error stops Run and is returned wrapped in a
	// *HandlerError. rec is the handler's to keep.
	Row(ctx context.Context, rec *outbox.Record) error
	// Commit ends every transaction, outbox or foreign: pos is the position
	// after it, rows the outbox rows it carried (all of them, also those
	// delivered before a reconnect). An error stops Run like Row's.
	Commit(ctx context.Context, pos position.Position, rows int) error
}

// Tailer streams the outbox rows of one table from the binlog. It holds only
// configuration: each Run owns its own connection and state, and a Tailer may
// run again after Run returned.
type Tailer struct {
	cfg           Config
	log           *zap.Logger
	schema, table []byte // cfg.Schema and cfg.Table, for allocation-free compares on the decode path
}

// New validates cfg (filling in defaults) and returns a Tailer.
func New(cfg Config) (*Tailer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Tailer{
		cfg:    cfg,
		log:    cfg.Logger.Named("canal"),
		schema: []byte(cfg.Schema),
		table:  []byte(cfg.Table),
	}, nil
}

// Run streams from `from` (exclusive: the first transaction delivered is the
// one after it) until ctx ends (it then returns ctx.Err()) or a fatal error:
// *PurgedError, *AccessError, *SchemaError, *StatementError,
// *XACommitError, *PreflightError, *DivergedError,
// *HandlerError, a *StopError from Config.CheckServer, or an undecodable
// event. Every other error (connection
// refused or reset, read timeout, server restart) is retried inside Run with
// jittered exponential backoff, resuming after the last transaction passed to
// Commit and skipping the rows of the interrupted transaction that Row
// already received, so the handler never sees a row twice nor misses one.
//
// A zero from starts at the oldest binlog the server still has. A position
// with a GTID set is streamed by GTID; one with only File and Pos by file
// offset (then Commit positions are file offsets too).
//
// All goroutines Run starts (go-mysql's reader) have ended when it returns.
func (t *Tailer) Run(ctx context.Context, from position.Position, h Handler) error {
	s := &session{t: t, h: h, committed: from, gtidMode: from.GTIDMode(), xaBook: newXABook()}
	switch {
	case t.cfg.Flavor != "" && from.Flavor != "" && from.Flavor != t.cfg.Flavor:
		return fmt.Errorf("canal: start position %s is of flavor %q but the tailer is configured for %q", from, from.Flavor, t.cfg.Flavor)
	case t.cfg.Flavor != "":
		s.flavor = t.cfg.Flavor
	case from.Flavor == FlavorMySQL || from.Flavor == FlavorMariaDB:
		s.flavor = from.Flavor
	case from.Flavor != "":
		return fmt.Errorf("canal: start position %s has unknown flavor %q", from, from.Flavor)
	}
	if s.flavor != "" {
		if err := s.init(s.flavor); err != nil {
			return fmt.Errorf("canal: %w", err)
		}
	}

	failures := 0
	for first := true; ; first = false {
		err := t.checkServer(ctx, first)
		if err == nil {
			err = t.stream(ctx, s)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if ferr := t.fatal(ctx, err, s); ferr != nil {
			return ferr // the caller logs it; it names the position
		}
		// Only a stream that yielded a row or a transaction was healthy.
		// One that merely lived long (a connection hanging until the read
		// timeout) was not: counting on, OnRetry's attempt tells how long
		// the trouble has lasted (the relay's --fallback-after).
		if s.progressed {
			failures = 0
		}
		failures++
		s.interrupted()
		wait := backoff.Delay(t.cfg.RetryMin, t.cfg.RetryMax, failures)
		t.log.Warn("binlog stream interrupted, reconnecting",
			zap.Error(err), zap.Int("attempt", failures), zap.Duration("backoff", wait),
			zap.Stringer("resume_after", s.committed), zap.Int("rows_to_skip", s.resumeRows))
		if t.cfg.OnRetry != nil {
			t.cfg.OnRetry(err, failures)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
}

// checkServer runs Config.CheckServer before a reconnected dump.
func (t *Tailer) checkServer(ctx context.Context, first bool) error {
	if first || t.cfg.CheckServer == nil {
		return nil
	}
	if err := t.cfg.CheckServer(ctx); err != nil {
		return fmt.Errorf("check the server before resuming the binlog stream: %w", err)
	}
	return nil
}

// stream runs one connection: it starts the dump from s.committed and feeds
// events to s until an error. The syncer (and its reader goroutine) is closed
// before it returns.
func (t *Tailer) stream(ctx context.Context, s *session) error {
	if s.flavor == "" {
		fl, err := t.detectFlavor(ctx)
		if err != nil {
			return err
		}
		if err := s.init(fl); err != nil {
			return err
		}
	}
	s.progressed = false
	syncer, st, err := t.startDump(s)
	if syncer != nil {
		defer syncer.Close()
	}
	if err != nil {
		return fmt.Errorf("start binlog dump after %s: %w", s.committed, err)
	}
	s.beginConnection()
	for first := true; ; first = false {
		ev, err := st.GetEvent(ctx)
		if err != nil {
			return fmt.Errorf("read binlog after %s: %w", s.committed, err)
		}
		if first && t.cfg.CheckDumpServer != nil {
			if err := t.cfg.CheckDumpServer(ev.Header.ServerID); err != nil {
				return fmt.Errorf("check the server of the binlog dump after %s: %w", s.committed, err)
			}
		}
		if err := s.event(ctx, ev); err != nil {
			return err
		}
	}
}

// startDump connects a new syncer and starts the dump from s.committed. The
// syncer is returned (for the caller to close) also with an error.
func (t *Tailer) startDump(s *session) (*replication.BinlogSyncer, *replication.BinlogStreamer, error) {
	return t.openSyncer(t.syncerConfig(s.flavor), func(syncer *replication.BinlogSyncer) (*replication.BinlogStreamer, error) {
		if s.gtidMode {
			// s.done holds the committed position; the dump starts after it.
			return syncer.StartSyncGTID(s.done.Set())
		}
		return syncer.StartSync(mysql.Position{Name: s.committed.File, Pos: s.committed.Pos})
	})
}

// openSyncer makes a syncer of conf with the connection's password of the
// moment and TLS, and starts it with start (which connects). With
// TLSPreferred, a server that does not offer TLS is connected to again
// without it. The syncer is returned (for the caller to close) also with an
// error from start.
func (t *Tailer) openSyncer(conf replication.BinlogSyncerConfig,
	start func(*replication.BinlogSyncer) (*replication.BinlogStreamer, error)) (*replication.BinlogSyncer, *replication.BinlogStreamer, error) {
	password, err := t.cfg.password()
	if err != nil {
		return nil, nil, err
	}
	conf.Password, conf.TLSConfig = password, t.cfg.TLS
	syncer := replication.NewBinlogSyncer(conf)
	st, err := start(syncer)
	if err != nil && conf.TLSConfig != nil && t.cfg.TLSPreferred && noTLSOffered(err) {
		syncer.Close()
		conf.TLSConfig = nil
		syncer = replication.NewBinlogSyncer(conf)
		st, err = start(syncer)
	}
	return syncer, st, err
}

// syncerConfig is the syncer configuration of the stream, without the
// connection's password and TLS (openSyncer adds them).
func (t *Tailer) syncerConfig(flavor string) replication.BinlogSyncerConfig {
	return replication.BinlogSyncerConfig{
		ServerID: t.cfg.ServerID,
		Flavor:   flavor,
		Host:     t.cfg.Host,
		Port:     uint16(t.cfg.Port),
		User:     t.cfg.User,
		// DATETIME → time.Time in UTC (go-mysql builds DATETIME values in UTC;
		// TIMESTAMP ones in Local, which .UTC() makes the same instant).
		ParseTime:       true,
		HeartbeatPeriod: t.cfg.HeartbeatPeriod,
		ReadTimeout:     t.cfg.ReadTimeout,
		// go-mysql's own retry re-delivers the last transaction and hides the
		// error; Run retries instead, from the last committed transaction.
		DisableRetrySync: true,
		VerifyChecksum:   true,
		EventCacheCount:  t.cfg.EventCacheCount,
		// Run tracks the GTID set from the GTID events itself (it needs it for
		// the duplicate guard anyway); this saves a set clone per commit.
		DiscardGTIDSet:      true,
		RowsEventDecodeFunc: t.decodeRows,
		Logger:              newSlogLogger(t.log),
	}
}

// decodeRows is the syncer's RowsEventDecodeFunc; it runs on go-mysql's
// reader goroutine and reads only immutable Tailer fields. The header is
// always decoded (it resolves the table and carries the end-of-statement flag
// the parser needs to drop its table maps); the rows only for WRITE_ROWS of
// the outbox table. Other rows events reach Run with Rows == nil.
func (t *Tailer) decodeRows(re *replication.RowsEvent, data []byte) error {
	pos, err := re.DecodeHeader(data)
	if err != nil {
		return err
	}
	if re.Type() != replication.EnumRowsEventTypeInsert || !t.isOutbox(re.Table) {
		return nil
	}
	return re.DecodeData(pos, data)
}

func (t *Tailer) isOutbox(tme *replication.TableMapEvent) bool {
	return tme != nil && bytes.EqualFold(tme.Table, t.table) && bytes.EqualFold(tme.Schema, t.schema)
}

// detectFlavor asks the server its version over go-mysql's client.
func (t *Tailer) detectFlavor(ctx context.Context) (string, error) {
	c, err := dial(ctx, &t.cfg)
	if err != nil {
		return "", fmt.Errorf("connect to %s to detect the server flavor: %w", t.cfg.addr(), err)
	}
	defer c.Close()
	return flavorOf(c.GetServerVersion()), nil
}

func flavorOf(version string) string {
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return FlavorMariaDB
	}
	return FlavorMySQL
}

// fatal returns the error Run should return for err, or nil when err is
// transient and the stream should be reconnected. A TLS failure is a
// *TLSError, never an *AccessError: a connection without TLS that the server
// denies is tried once over TLS (ExplainConnectError) to tell the two apart.
func (t *Tailer) fatal(ctx context.Context, err error, s *session) error {
	if err == nil {
		return nil
	}
	var te *TLSError
	if errors.As(err, &te) {
		return fmt.Errorf("canal: %w", err)
	}
	if te := ExplainConnectError(ctx, t.cfg, err); te != err {
		return fmt.Errorf("canal: %w", te)
	}
	var (
		pe   *PreflightError
		stop *StopError
		se   *SchemaError
		ste  *StatementError
		xae  *XACommitError
		he   *HandlerError
		de   *DivergedError
		ee   *replication.EventError
		me   *mysql.MyError
		fe   *fatalError
	)
	switch {
	case errors.As(err, &stop):
		return fmt.Errorf("canal: %w", err)
	case errors.As(err, &pe), errors.As(err, &se), errors.As(err, &ste), errors.As(err, &xae), errors.As(err, &he), errors.As(err, &de):
		return fmt.Errorf("canal: %w", err)
	case errors.As(err, &fe):
		return fmt.Errorf("canal: %w", fe.err)
	case errors.As(err, &ee):
		// A decode failure repeats on every re-read: retrying cannot help.
		return fmt.Errorf("canal: decode binlog event after %s: %w", s.committed, err)
	case errors.As(err, &me):
		switch me.Code {
		case mysql.ER_MASTER_FATAL_ERROR_READING_BINLOG:
			if msg := strings.ToLower(me.Message); strings.Contains(msg, "server_id") || strings.Contains(msg, "server_uuid") {
				return fmt.Errorf("canal: %w", &PreflightError{
					Check:   CheckServerID,
					Problem: "the server refused the binlog dump: " + me.Message,
					Fix:     "give this relay a Config.ServerID no other replica or binlog client of the server uses",
				})
			}
			if strings.Contains(strings.ToUpper(me.Message), "GTID_MODE = OFF") {
				// MySQL with gtid_mode OFF refuses a dump by GTID set: not a purge.
				return fmt.Errorf("canal: %w", &PreflightError{
					Check:   CheckGTIDMode,
					Problem: fmt.Sprintf("the server refused a binlog dump from %s by GTID set: %s", s.committed, me.Message),
					Fix: "set gtid_mode=ON with enforce_gtid_consistency=ON (stepping gtid_mode through OFF_PERMISSIVE and ON_PERMISSIVE), " +
						"or start from a file and offset (SHOW BINARY LOG STATUS)",
				})
			}
			return fmt.Errorf("canal: %w", &PurgedError{Position: s.committed, Detail: me.Message})
		case mysql.ER_ACCESS_DENIED_ERROR, mysql.ER_DBACCESS_DENIED_ERROR, mysql.ER_SPECIFIC_ACCESS_DENIED_ERROR,
			mysql.ER_TABLEACCESS_DENIED_ERROR, mysql.ER_COLUMNACCESS_DENIED_ERROR, mysql.ER_ACCESS_DENIED_NO_PASSWORD_ERROR:
			return fmt.Errorf("canal: %w", &AccessError{User: t.cfg.User, Detail: me.Message})
		}
	}
	return nil
}

// fatalError marks an error of the tailer's own making that retrying cannot
// cure (a malformed start position).
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }
