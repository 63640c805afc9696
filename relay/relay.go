package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/backoff"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/position"
)

// Relay publishes one outbox table's rows to RabbitMQ.
type Relay struct {
	cfg   Config
	log   *zap.Logger
	db    *sql.DB
	store *checkpoint.Store
	canal canal.Config

	tailing atomic.Bool  // leading, and reading the binlog past the first-start sweep
	polling atomic.Bool  // leading in poll mode
	mode    atomic.Value // string: the mode of the current term

	notReady atomic.Value // string: why the relay is not ready ("" when a healthy standby)

	// published is the newest position this process acknowledged, kept
	// across reconnects and leader terms: the failover check (checkNotLost)
	// compares it with each server it resumes on.
	publishedMu  sync.Mutex
	published    position.Position
	recent       []recentTxn       // the latest acknowledged transactions with rows (noteResolved)
	recentRows   int               // message ids in recent
	lastResolved position.Position // position of the last transaction noteResolved saw
}

// Ready is nil when the relay does its job: it leads and delivers (tails the
// binlog or polls), or it is a standby whose last attempt at leadership
// reached the database. Otherwise it says what is wrong. No I/O: /readyz
// calls it.
func (r *Relay) Ready() error {
	if r.Tailing() || r.Polling() {
		return nil
	}
	if msg, _ := r.notReady.Load().(string); msg != "" {
		return errors.New(msg)
	}
	return nil
}

// Polling reports whether the relay leads in poll mode.
func (r *Relay) Polling() bool { return r.polling.Load() }

// Tailing reports whether the relay leads and is reading the binlog live: any
// row committed from now on is published from the binlog stream.
func (r *Relay) Tailing() bool { return r.tailing.Load() }

// New validates cfg and opens the database pool; it does not connect yet.
func New(cfg Config) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dsn, _ := mysql.ParseDSN(cfg.MySQLDSN) // Validate parsed it
	// The relay reads and writes DATETIME(6) values as UTC; a session time
	// zone makes NOW(6) and the stored values agree whatever the server's is.
	dsn.ParseTime = true
	dsn.Loc = time.UTC
	if dsn.Params == nil {
		dsn.Params = map[string]string{}
	}
	dsn.Params["time_zone"] = "'+00:00'"
	connector, err := mysql.NewConnector(dsn)
	if err != nil {
		return nil, &ConfigError{fmt.Errorf("mysql-dsn: %s", redactErr(err, cfg.MySQLDSN))}
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(8)
	// As many idle as open: poll workers and the acker would otherwise
	// reconnect (handshake, SET time_zone) on every round.
	db.SetMaxIdleConns(8)
	db.SetConnMaxIdleTime(time.Minute)

	host, portStr, err := net.SplitHostPort(dsn.Addr)
	if err != nil {
		host, portStr = dsn.Addr, "3306"
	}
	port, _ := strconv.Atoi(portStr)
	store, err := checkpoint.New(db, checkpoint.Config{
		RelayName: cfg.RelayName, Table: cfg.Table, OnDelivered: cfg.OnDelivered,
		Instance: cfg.Instance, HeartbeatInterval: cfg.HeartbeatInterval, LeaderLease: cfg.LeaderLease,
	})
	if err != nil {
		db.Close()
		return nil, &ConfigError{err}
	}
	return &Relay{
		cfg: cfg, log: cfg.Logger, db: db, store: store,
		canal: canal.Config{
			Host: host, Port: port, User: dsn.User, Password: dsn.Passwd,
			ServerID: cfg.ServerID, Schema: dsn.DBName, Table: cfg.Table, Logger: cfg.Logger.Named("canal"),
		},
	}, nil
}

// Close releases the database pool.
func (r *Relay) Close() error { return r.db.Close() }

// Run relays until ctx ends (then it shuts down cleanly and returns nil) or a
// fatal error: a *ConfigError for setup problems retrying cannot fix (binlog
// settings, grants, purged checkpoint), another error for a runtime failure.
// Transient trouble — database or broker down, leadership lost — is retried
// with backoff, resuming from the durable checkpoint.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.preflight(ctx); err != nil {
		return err
	}
	r.mode.Store("")
	r.notReady.Store("starting")
	m := r.cfg.Metrics
	retry := &backoff.Counter{Min: 200 * time.Millisecond, Max: 10 * time.Second}
	for {
		leader, err := r.store.Acquire(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, checkpoint.ErrHeld):
			r.notReady.Store("")
			m.SetMode("")
			d := r.cfg.StandbyRetry
			var held *checkpoint.HeldError
			if errors.As(err, &held) {
				r.log.Info("standby: another instance leads this relay name", zap.String("relay", r.cfg.RelayName),
					zap.String("leader", held.Leader), zap.Duration("heartbeat_age", held.Age))
				// Look again just after the leader's lease would end.
				if rest := held.Lease - held.Age + 100*time.Millisecond; rest > 0 && rest < d {
					d = rest
				}
			}
			if !backoff.Sleep(ctx, d) {
				return nil
			}
			continue
		case err != nil:
			d := retry.Next()
			r.notReady.Store("cannot reach the database to take leadership: " + err.Error())
			m.Reconnected(metrics.TargetMySQL)
			r.log.Warn("cannot take leadership, retrying", zap.Error(err), zap.Duration("in", d))
			if !backoff.Sleep(ctx, d) {
				return nil
			}
			continue
		}
		if took := leader.TookOver(); took != "" {
			r.log.Warn("leading: "+took, zap.String("relay", r.cfg.RelayName), zap.Int64("epoch", leader.Epoch()))
		} else {
			r.log.Info("leading", zap.String("relay", r.cfg.RelayName), zap.Int64("epoch", leader.Epoch()))
		}
		r.notReady.Store("leading, not yet delivering")
		m.SetLeader(true)
		started := time.Now()
		err = r.lead(ctx, leader)
		m.SetLeader(false)
		m.SetMode("")
		r.notReady.Store("leadership ended: restarting")
		if time.Since(started) > time.Minute {
			retry.Reset() // a long healthy term: start the backoff over
		}
		releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = leader.Release(releaseCtx)
		cancel()
		if ctx.Err() != nil {
			if err != nil && !errors.Is(err, context.Canceled) {
				r.log.Warn("shutdown finished with an error", zap.Error(err))
			}
			return nil
		}
		if isFatal(err) {
			return err
		}
		d := retry.Next()
		r.log.Warn("relay pipeline stopped, restarting from the checkpoint", zap.Error(err), zap.Duration("in", d))
		recCtx, cancelRec := context.WithTimeout(ctx, 5*time.Second)
		_ = r.store.RecordError(recCtx, leader.Epoch(), err.Error())
		cancelRec()
		if !backoff.Sleep(ctx, d) {
			return nil
		}
	}
}

// preflight checks the server once, before leadership: a server that cannot
// serve binlog mode is a setup error, reported with the fix.
func (r *Relay) preflight(ctx context.Context) error {
	var err error
	for attempt := 0; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = r.db.PingContext(pctx)
		cancel()
		if err == nil || ctx.Err() != nil || attempt == 4 {
			break
		}
		if !backoff.Sleep(ctx, time.Second) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("connect to MySQL %s: %w", r.canal.Host, err)
	}
	if r.cfg.Mode != ModeBinlog {
		return nil // auto falls back to polling; poll needs no binlog
	}
	if err := canal.Preflight(ctx, r.db, r.canal); err != nil {
		return &ConfigError{err}
	}
	return nil
}

func isFatal(err error) bool {
	var cfgErr *ConfigError
	var schemaErr *canal.SchemaError
	var purged *canal.PurgedError
	var lost *LostGTIDsError
	return errors.As(err, &cfgErr) || errors.As(err, &schemaErr) || errors.As(err, &purged) || errors.As(err, &lost)
}
