package checkpoint

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrHeld means another relay instance of the same name holds leadership;
// this one is a standby and should try again later.
var ErrHeld = errors.New("another instance holds leadership")

// Leader is held leadership of one relay name. The MySQL user lock lives on a
// dedicated connection: if that connection dies the server releases the lock,
// so losing it must stop publishing at once — Lost is closed then.
type Leader struct {
	store *Store
	conn  *sql.Conn
	epoch int64

	lost     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	err      error
	stopOnce sync.Once
}

func (s *Store) lockName() string { return "outbox-relay:" + s.cfg.RelayName }

// Acquire takes leadership without waiting: ErrHeld when another instance has
// it. On success the epoch in the progress row is one more than any earlier
// leader's, and a heartbeat runs until Release or loss.
func (s *Store) Acquire(ctx context.Context) (*Leader, error) {
	if _, err := s.Load(ctx); err != nil { // make sure the row exists
		return nil, err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("open leadership connection: %w", err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", s.lockName()).Scan(&got); err != nil {
		conn.Close()
		return nil, fmt.Errorf("take lock %q: %w", s.lockName(), err)
	}
	if !got.Valid || got.Int64 != 1 {
		conn.Close()
		return nil, ErrHeld
	}
	l := &Leader{store: s, conn: conn, lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	if err := l.bumpEpoch(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	go l.heartbeat()
	return l, nil
}

func (l *Leader) bumpEpoch(ctx context.Context) error {
	s := l.store
	if _, err := l.conn.ExecContext(ctx, `UPDATE outbox_relay_progress SET epoch = epoch + 1,
		leader_instance = ?, leader_since = NOW(6), leader_heartbeat = NOW(6) WHERE relay_name = ?`,
		s.cfg.Instance, s.cfg.RelayName); err != nil {
		return fmt.Errorf("bump leader epoch of relay %q: %w", s.cfg.RelayName, err)
	}
	if err := l.conn.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ?",
		s.cfg.RelayName).Scan(&l.epoch); err != nil {
		return fmt.Errorf("read leader epoch of relay %q: %w", s.cfg.RelayName, err)
	}
	return nil
}

// Epoch is this leader's fencing token.
func (l *Leader) Epoch() int64 { return l.epoch }

// Lost is closed when leadership is lost (the lock connection failed or the
// progress row moved to a newer epoch). Err says why.
func (l *Leader) Lost() <-chan struct{} { return l.lost }

// Err is why leadership was lost, nil while it is held.
func (l *Leader) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Lose ends leadership from outside the heartbeat, at once: a write of this
// leader found the progress row at a newer epoch (err is ErrFenced, possibly
// wrapped). Lost is closed and Err returns err; the lock is still held until
// Release. Only the first loss is kept.
func (l *Leader) Lose(err error) { l.fail(err) }

func (l *Leader) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
		close(l.lost)
	}
}

// heartbeat proves the lock connection alive and the epoch still ours. A
// silent network drop is caught by the per-beat timeout.
func (l *Leader) heartbeat() {
	defer close(l.done)
	s := l.store
	t := time.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*s.cfg.HeartbeatInterval)
		var epoch int64
		_, err := l.conn.ExecContext(ctx, `UPDATE outbox_relay_progress SET leader_heartbeat = NOW(6)
			WHERE relay_name = ? AND epoch = ?`, s.cfg.RelayName, l.epoch)
		if err == nil {
			err = l.conn.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ?",
				s.cfg.RelayName).Scan(&epoch)
		}
		cancel()
		switch {
		case err != nil:
			l.fail(fmt.Errorf("leadership heartbeat of relay %q: %w", s.cfg.RelayName, err))
			return
		case epoch != l.epoch:
			l.fail(ErrFenced)
			return
		}
	}
}

// Release gives leadership up: stops the heartbeat, releases the lock and
// closes the lock connection. Safe to call more than once.
func (l *Leader) Release(ctx context.Context) error {
	var err error
	l.stopOnce.Do(func() {
		close(l.stop)
		<-l.done
		l.fail(errors.New("leadership released"))
		if _, e := l.conn.ExecContext(ctx, "DO RELEASE_LOCK(?)", l.store.lockName()); e != nil && !errors.Is(e, sql.ErrConnDone) {
			err = fmt.Errorf("release lock %q: %w", l.store.lockName(), e)
		}
		l.conn.Close()
	})
	return err
}
