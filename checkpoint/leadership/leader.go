package leadership

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// ErrHeld means another relay instance of the same name holds leadership;
// this one is a standby and should try again later. Acquire returns it as a
// *HeldError.
var ErrHeld = errors.New("another instance holds leadership")

// ErrLeaseExpired means this leader has not renewed its lease in time (its
// process was stopped, or the database did not answer its heartbeats): a
// standby may already have taken over, so it must not publish anything more.
var ErrLeaseExpired = errors.New("leadership lease expired without a heartbeat")

// HeldError is ErrHeld with what a standby saw of the leader.
type HeldError struct {
	Leader string        // leader_instance of the progress row
	Age    time.Duration // how old the leader's heartbeat is, by the server's clock
	Lease  time.Duration
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s (%s, heartbeat %v old)", ErrHeld, e.Leader, e.Age.Round(time.Millisecond))
}

func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// Leader is held leadership of one relay name.
//
// Leadership is two things taken together: the MySQL user lock
// GET_LOCK('outbox-relay:<name>') on a dedicated connection, and a new epoch
// in the progress row, which fences every write of an older leader. It is
// kept by a heartbeat on the lock connection every HeartbeatInterval, and it
// is a lease: a leader is valid only until LeaderLease less a tenth after
// the start of its last successful heartbeat (its own monotonic clock). The
// stored heartbeat is written after the leader started it, so by the
// server's clock a leader's lease ends before its stored heartbeat is
// LeaderLease old (the tenth covers a difference in the rates of the two
// clocks; their rates are assumed to differ by less). A new leader publishes
// only once the previous leader's stored heartbeat is that old, or once the
// previous leader released leadership (its term is over): a standby takes
// over a held lock only then, and one that finds the lock free while the
// stored heartbeat is younger waits out the rest of the lease before Acquire
// returns. The lock alone proves nothing: the lock connection of a stopped
// leader can be closed (a proxy's idle timeout, a KILL) while the leader,
// woken inside its lease, still publishes what it had read.
//
// The heartbeat is one statement per HeartbeatInterval, on a connection of
// its own: an UPDATE of leader_heartbeat fenced by the epoch and by the
// status last read, so that one row changed says the epoch is still ours
// and the status unchanged (the progress row is read only when it says
// otherwise). The lock connection meanwhile waits in one long DO SLEEP
// (LockWatch): a killed or cut connection ends that wait at once, so a lost
// lock is noticed at once (a silently stalled network when TCP keepalive
// gives up, or at the wait's deadline). A leader whose lock connection died
// unnoticed is fenced anyway: the next leader bumps the epoch before it
// publishes, and this leader's next heartbeat then changes no row.
//
// One relay name per outbox table: the lock connection also holds the
// table's lock (checkpoint.TableLockName) for the whole term, taken after
// the epoch bump has recorded the table (outbox_table) and the lease in
// the progress row (claimTable). A relay of another name that finds it
// held by a live leader is refused (*TableLedError); the heartbeat
// statement also requires that the lock connection still holds it.
type Leader struct {
	el       *Elector
	conn     *sql.Conn // holds the lock; waits in DO SLEEP while leading
	beatConn *sql.Conn // runs the heartbeat
	connID   int64
	epoch    int64
	status   string // the status read with the epoch; the heartbeat's
	takeover string
	// database is the current database of the lock connection, where the
	// outbox table is; tableLock is the table's lock, which the lock
	// connection holds beside the name's (claimTable).
	database, tableLock string
	// prevConn is the lock connection of this name's previous leader, as
	// its row recorded it before this leader's epoch bump (0 when not
	// recorded): claimTable waits for it to let go of the table's lock.
	prevConn int64
	wake     chan struct{} // the lock connection's wait was interrupted: beat now

	lost       chan struct{}
	stopCtx    context.Context
	stop       context.CancelFunc
	done       chan struct{}
	expiry     *time.Timer
	mu         sync.Mutex
	err        error
	validUntil time.Time
	stopOnce   sync.Once

	paused        bool          // the stored status is PAUSED, as last read
	statusChanged chan struct{} // closed when paused next changes
}

func (s *Elector) lockName() string { return checkpoint.LockName(s.cfg.RelayName) }

// Led reports whether a session holds the relay name's leadership lock: a
// leader runs (false also when the question could not be asked).
func (s *Elector) Led(ctx context.Context) bool {
	var id sql.NullInt64
	err := s.db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", s.lockName()).Scan(&id)
	return err == nil && id.Valid
}

// Acquire takes leadership: a *HeldError (errors.Is ErrHeld) when another
// instance has it, a *TableLedError (errors.Is ErrTableLed) when a live
// leader of another relay name holds the outbox table's lock (Config.Table;
// the refused term's epoch is spent, see giveUp), another error when the
// database failed or the table's lock stayed held by a connection that is
// not a live leader of another name (retry). A leader whose stored
// heartbeat is older than LeaderLease is taken over: its lock connection is
// killed (the relay's user may kill its own connections) and the lock taken.
// Whenever the previous leader did not release leadership, the connections
// of its poll workers and acknowledgements are killed too, before the epoch bump and again after
// waiting out its lease (endPollers): their rounds roll back and free the
// partition heads they held. On success the epoch in the
// progress row is one more than any earlier leader's, a heartbeat runs until
// Release or loss, and the previous leader can publish no more: when it had
// not released leadership and its stored heartbeat is younger than
// LeaderLease, Acquire holds the lock and the new epoch (so no other
// standby leads, and the previous leader's writes are fenced at once) and
// waits, logging it once, until the heartbeat is LeaderLease old. The wait
// ends early, with an error and leadership given up, when ctx ends or the
// new leadership is lost.
func (s *Elector) Acquire(ctx context.Context) (*Leader, error) { return s.AcquireWithin(ctx, 0) }

// AcquireWithin is Acquire that, while another instance holds leadership,
// waits for its lock to be free (a leader that releases, dies or loses its
// lock connection) and takes leadership then, at once: up to wait, and not
// past the moment the leader's lease would end without another heartbeat
// (so a stopped leader is taken over just after its lease, on the next
// call). A standby looking again and again this way sends one statement
// per look.
//
// When ctx ends, the error wraps ctx's error (a statement cut by the end of
// ctx may fail as a bad connection instead).
func (s *Elector) AcquireWithin(ctx context.Context, wait time.Duration) (*Leader, error) {
	l, err := s.acquireWithin(ctx, wait)
	if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	return l, err
}

func (s *Elector) acquireWithin(ctx context.Context, wait time.Duration) (*Leader, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("open leadership connection: %w", err)
	}
	l := &Leader{el: s, conn: conn, lost: make(chan struct{}), done: make(chan struct{}), statusChanged: make(chan struct{})}
	err = l.lock(ctx, wait)
	if errors.Is(err, errNoRow) {
		if err = checkpoint.EnsureRow(ctx, s.db, s.cfg.RelayName); err == nil {
			err = l.lock(ctx, wait)
		}
	}
	switch {
	case errors.Is(err, ErrHeld) || errors.Is(err, errNoRow):
		conn.Close() // no lock taken: the connection goes back to the pool
		return nil, err
	case err != nil:
		discard(conn) // the statement may have taken the lock
		return nil, err
	}
	prev, err := l.previous(ctx)
	if err != nil {
		discard(conn) // it holds the name's lock
		return nil, err
	}
	sent := time.Now()
	stopKilling := func() {}
	if l.takeover != "" || prev.instance != "" {
		// The previous leader, not released, may have been stopped inside
		// poll rounds that lock partition heads, or inside a transaction
		// that locks the progress row (an acknowledgement's fence, a poll
		// round's): end them, or this leader would find those partitions
		// held, and the epoch bump would wait, as long as it is stopped.
		l.endPollers(ctx)
		stopKilling = l.killBlockers(ctx)
	}
	err = l.bumpEpoch(ctx)
	stopKilling()
	if err != nil {
		discard(conn) // it holds the name's lock
		return nil, err
	}
	other, err := l.claimTable(ctx)
	if err != nil {
		l.giveUp(ctx, err, prev)
		return nil, err
	}
	if other.wait > prev.wait {
		prev = other
	}
	if l.beatConn, err = s.db.Conn(ctx); err != nil {
		l.giveUp(ctx, err, prev)
		return nil, fmt.Errorf("open the heartbeat connection of relay %q: %w", s.cfg.RelayName, err)
	}
	l.stopCtx, l.stop = context.WithCancel(context.Background())
	l.validUntil = sent.Add(s.validity())
	l.expiry = time.AfterFunc(s.validity(), func() { l.fail(ErrLeaseExpired) })
	l.wake = make(chan struct{}, 1)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		l.watch()
	}()
	go func() {
		defer close(l.done)
		l.heartbeat()
		<-watchDone
	}()
	if prev.wait > 0 {
		if err := l.waitOut(ctx, prev); err != nil {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			l.abandon(actx)
			cancel()
			return nil, err
		}
		// Woken inside its lease, the previous leader may have begun
		// another round meanwhile: its lease is over now, so that round
		// can publish nothing, but it may hold partition heads.
		l.endPollers(ctx)
	}
	return l, nil
}

// previousLeader is what the progress row says of the previous leader, read
// once this one holds the lock, and how long its lease still runs: the
// previous leader of this relay name, or a leader of another relay name on
// the same table whose lock connection is gone (claimTable).
type previousLeader struct {
	relayName string        // "" for this relay name
	instance  string        // leader_instance; "" when it released leadership (or none ever led)
	age       time.Duration // its stored heartbeat's age by the server's clock
	lease     time.Duration // its lease
	wait      time.Duration // until the heartbeat is its lease old; 0 when it released leadership
}

// previous reads the previous leader with the lock held: its lock
// connection is gone, so its heartbeat can no longer move. It also keeps
// the previous leader's recorded lock connection (prevConn), which the
// epoch bump overwrites. A leader that
// released leadership (leader_instance NULL), or whose term this elector
// released (its epoch), has stopped publishing: no wait.
func (l *Leader) previous(ctx context.Context) (previousLeader, error) {
	s := l.el
	var (
		leader sql.NullString
		epoch  int64
		ageUS  sql.NullInt64
		connID sql.NullInt64
	)
	if err := l.conn.QueryRowContext(ctx, `SELECT leader_instance, epoch,
		TIMESTAMPDIFF(MICROSECOND, leader_heartbeat, NOW(6)), leader_conn_id FROM outbox_relay_progress WHERE relay_name = ?`,
		s.cfg.RelayName).Scan(&leader, &epoch, &ageUS, &connID); err != nil {
		return previousLeader{}, fmt.Errorf("read the previous leader of relay %q: %w", s.cfg.RelayName, err)
	}
	// Also a released leader's: the server may not yet have let go of
	// its table's lock when this one has the name's (claimTable).
	l.prevConn = connID.Int64
	s.mu.Lock()
	ours := s.released != 0 && epoch == s.released
	s.mu.Unlock()
	if !leader.Valid || ours {
		return previousLeader{}, nil
	}
	p := previousLeader{instance: leader.String, age: time.Duration(ageUS.Int64) * time.Microsecond, lease: s.cfg.LeaderLease}
	if ageUS.Valid && p.age < s.cfg.LeaderLease {
		p.wait = s.cfg.LeaderLease - p.age
	}
	return p, nil
}

// waitOut waits, holding leadership, until the previous leader's lease has
// run out: p.wait from now (counted from after the server measured the age,
// so never short). It returns early with an error when ctx ends or this
// leadership is lost.
func (l *Leader) waitOut(ctx context.Context, p previousLeader) error {
	s := l.el
	until := time.Now().Add(p.wait)
	who := "the previous leader"
	if p.relayName != "" {
		who = fmt.Sprintf("relay name %q's leader on outbox table %q", p.relayName, s.cfg.Table)
		l.addTakeover(fmt.Sprintf("took outbox table %q over from relay name %q's leader %s after waiting out its lease: the table's lock was free with its heartbeat %v old (lease %v)",
			s.cfg.Table, p.relayName, p.instance, p.age.Round(time.Millisecond), p.lease))
	} else {
		l.addTakeover(fmt.Sprintf("took over from %s after waiting out its lease: its lock was free with its heartbeat %v old (lease %v)",
			p.instance, p.age.Round(time.Millisecond), p.lease))
	}
	s.cfg.Logger.Warn(fmt.Sprintf("%s's lease runs until %s, waiting %v before publishing",
		who, until.UTC().Format("15:04:05.000Z"), p.wait.Round(100*time.Millisecond)),
		zap.String("relay", s.cfg.RelayName), zap.String("previous_leader", p.instance),
		zap.Duration("heartbeat_age", p.age), zap.Int64("epoch", l.epoch))
	t := time.NewTimer(p.wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait out the lease of %s %s of relay %q: %w", who, p.instance, s.cfg.RelayName, ctx.Err())
	case <-l.lost:
		return fmt.Errorf("lost leadership of relay %q while waiting out the lease of %s %s: %w",
			s.cfg.RelayName, who, p.instance, l.Err())
	}
}

// validity is how long after the start of a successful heartbeat a leader
// may go on: the lease less a tenth for the rates of two clocks.
func (s *Elector) validity() time.Duration { return s.cfg.LeaderLease - s.cfg.LeaderLease/10 }

// errNoRow is lock's error when the relay has no progress row yet.
var errNoRow = errors.New("no progress row")

// lock takes the user lock on l.conn, taking over from a leader whose
// heartbeat is older than the lease. While another instance holds the lock
// it waits for it up to wait, but not past the moment the holder's lease
// would end without a further heartbeat: one statement reads the leader's
// row, and tries (or waits for) the lock for that long.
func (l *Leader) lock(ctx context.Context, wait time.Duration) error {
	s := l.el
	var (
		got    sql.NullInt64
		holder sql.NullInt64
		leader sql.NullString
		ageUS  sql.NullInt64
	)
	err := l.conn.QueryRowContext(ctx, `SELECT CONNECTION_ID(),
		GET_LOCK(?, GREATEST(0, LEAST(?, COALESCE((? - TIMESTAMPDIFF(MICROSECOND, leader_heartbeat, NOW(6))) / 1000000 + 0.1, 0)))),
		IS_USED_LOCK(?), leader_instance, TIMESTAMPDIFF(MICROSECOND, leader_heartbeat, NOW(6))
		FROM outbox_relay_progress WHERE relay_name = ?`,
		s.lockName(), wait.Seconds(), s.cfg.LeaderLease.Microseconds(), s.lockName(), s.cfg.RelayName).
		Scan(&l.connID, &got, &holder, &leader, &ageUS)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return errNoRow
	case err != nil:
		return fmt.Errorf("take lock %q: %w", s.lockName(), err)
	case got.Valid && got.Int64 == 1:
		return nil
	}
	// The heartbeat's age when the statement started, before its wait.
	age := time.Duration(ageUS.Int64) * time.Microsecond
	held := &HeldError{Leader: leader.String, Age: age, Lease: s.cfg.LeaderLease}
	if !holder.Valid {
		return held // released in between: the next attempt takes it
	}
	if ageUS.Valid && age <= s.cfg.LeaderLease {
		return held
	}
	if err := l.holderElsewhere(ctx, holder.Int64); err != nil {
		return err
	}
	// The leader's lease has expired (it cannot publish any more, see
	// Leader) but its connection still holds the lock: a stopped or hung
	// process. End that connection; the server then releases the lock.
	if _, err := l.conn.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", holder.Int64)); err != nil {
		if isKillDenied(err) {
			return fmt.Errorf("take over relay %q from %s (heartbeat %v old): connection %d holds its lock %q and belongs to another MySQL user, "+
				"most likely a relay of the same name for another database of this server (lock names are the server's): "+
				"give this relay a --relay-name of its own; if it is a hung leader of this database, grant this user CONNECTION_ADMIN (or SUPER) so that a standby can end it: %w",
				s.cfg.RelayName, leader.String, age.Round(time.Millisecond), holder.Int64, s.lockName(), err)
		}
		if !isUnknownThread(err) {
			return fmt.Errorf("take over relay %q from %s (heartbeat %v old): kill its lock connection %d: %w",
				s.cfg.RelayName, leader.String, age.Round(time.Millisecond), holder.Int64, err)
		}
	}
	ok, err := l.getLock(ctx, 5)
	if err != nil {
		return err
	}
	if !ok {
		return held // another standby was quicker
	}
	l.takeover = fmt.Sprintf("took over from %s, whose heartbeat was %v old (lease %v)",
		leader.String, age.Round(time.Millisecond), s.cfg.LeaderLease)
	return nil
}

// killBlockers, while the epoch bump of a takeover runs, kills the
// connections whose transactions make it wait more than a moment: the
// previous leader's, which did not release leadership (rolling its
// transaction back is always safe: a write it did not commit is redone or
// fenced, and once its lease has expired it must not commit anything any
// more). It needs the PROCESS privilege to see them; without it the
// bump waits for innodb_lock_wait_timeout and the takeover is retried.
// The returned function stops it and waits for it.
func (l *Leader) killBlockers(ctx context.Context) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rows, err := l.el.db.QueryContext(ctx, `SELECT DISTINCT b.trx_mysql_thread_id
				FROM information_schema.INNODB_LOCK_WAITS w
				JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id
				JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id
				WHERE r.trx_mysql_thread_id = ?`, l.connID)
			if err != nil {
				return
			}
			var ids []int64
			for rows.Next() {
				var id int64
				if rows.Scan(&id) == nil {
					ids = append(ids, id)
				}
			}
			rows.Close()
			for _, id := range ids {
				_, _ = l.el.db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id))
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

func (l *Leader) getLock(ctx context.Context, waitSeconds int) (bool, error) {
	var got sql.NullInt64
	if err := l.conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", l.el.lockName(), waitSeconds).Scan(&got); err != nil {
		return false, fmt.Errorf("take lock %q: %w", l.el.lockName(), err)
	}
	return got.Valid && got.Int64 == 1, nil
}

func (l *Leader) bumpEpoch(ctx context.Context) error {
	s := l.el
	if _, err := l.conn.ExecContext(ctx, `UPDATE outbox_relay_progress SET epoch = epoch + 1,
		leader_instance = ?, leader_since = NOW(6), leader_heartbeat = NOW(6), outbox_table = ?, leader_lease_ms = ?,
		leader_conn_id = CONNECTION_ID() WHERE relay_name = ?`,
		s.cfg.Instance, s.cfg.Table, s.cfg.LeaderLease.Milliseconds(), s.cfg.RelayName); err != nil {
		return fmt.Errorf("bump leader epoch of relay %q: %w", s.cfg.RelayName, err)
	}
	var status string
	if err := l.conn.QueryRowContext(ctx, "SELECT epoch, status, DATABASE() FROM outbox_relay_progress WHERE relay_name = ?",
		s.cfg.RelayName).Scan(&l.epoch, &status, &l.database); err != nil {
		return fmt.Errorf("read leader epoch of relay %q: %w", s.cfg.RelayName, err)
	}
	l.tableLock = checkpoint.TableLockName(l.database, s.cfg.Table)
	l.paused = status == checkpoint.StatusPaused
	l.status = status
	return nil
}

// Paused reports whether the relay's stored status is PAUSED, as of the
// last heartbeat (or the start of leadership), and returns a channel that
// is closed when that next changes. `pause` and `resume` wake the
// heartbeat (Wake), so a change is seen at once; without the wake, at the
// next heartbeat.
func (l *Leader) Paused() (bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.paused, l.statusChanged
}

func (l *Leader) setPaused(paused bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if paused != l.paused {
		l.paused = paused
		close(l.statusChanged)
		l.statusChanged = make(chan struct{})
	}
}

// Epoch is this leader's fencing token.
func (l *Leader) Epoch() int64 { return l.epoch }

// addTakeover adds what this leader took over to TookOver's description.
func (l *Leader) addTakeover(what string) {
	if l.takeover != "" {
		l.takeover += "; "
	}
	l.takeover += what
}

// giveUp gives up the leadership an Acquire took before its heartbeat ran,
// when claiming the table (or opening the heartbeat's connection) failed
// with err; prev is this name's previous leader as Acquire read it. It
// always releases the locks. Only when err is the refusal (ErrTableLed)
// and no previous leader's lease was to be waited out does it also end
// the term: it clears leader_instance (fenced by the epoch, so status
// shows no leader of this name) and a later Acquire of this Elector does
// not wait out this term's lease. Otherwise (a database error, or a
// refusal while a previous leader may still publish) the row keeps this
// term's leader and fresh heartbeat, so the next leader of this name
// waits out this lease, which ends after the previous leader's: clearing
// it would let the next leader publish beside the previous one. Errors
// of giving up are logged; the caller returns err.
func (l *Leader) giveUp(ctx context.Context, err error, prev previousLeader) {
	s := l.el
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var gerr error
	if refusalEndsTerm(err, prev) {
		s.mu.Lock()
		s.released = l.epoch
		s.mu.Unlock()
		gerr = l.clearLeader(ctx)
	}
	if gerr = errors.Join(gerr, l.unlock(ctx)); gerr != nil {
		s.cfg.Logger.Warn("giving up leadership not taken: the row or the locks are left for the lease to end",
			zap.String("relay", s.cfg.RelayName), zap.Int64("epoch", l.epoch), zap.NamedError("cause", err), zap.Error(gerr))
	}
}

// refusalEndsTerm reports whether giveUp ends the term (clears the row):
// only a refusal, and only when no previous leader's lease was still to be
// waited out.
func refusalEndsTerm(err error, prev previousLeader) bool {
	return errors.Is(err, ErrTableLed) && prev.wait == 0
}

// TookOver describes the previous leader this one took over from: a stale
// one whose lock connection it killed, or one whose lease it waited out
// because its lock was free before its lease had run out; "" when the lock
// was free and the previous leader released or its lease had run out.
func (l *Leader) TookOver() string { return l.takeover }

// Valid reports whether this leader may publish now: leadership not lost
// and the lease not expired. Check it after reading a row and before
// publishing it: a row read after a stop longer than the lease is then never
// published by this (stale) leader. Finding the lease expired ends
// leadership at once (Lost closed, Err ErrLeaseExpired), without waiting for
// the expiry timer, which a process just woken from a stop may not have run
// yet.
func (l *Leader) Valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil && !time.Now().Before(l.validUntil) {
		l.err = ErrLeaseExpired
		close(l.lost)
	}
	return l.err == nil
}

// Lost is closed when leadership is lost (the lock connection failed, the
// lease expired or the progress row moved to a newer epoch). Err says why.
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

// renew extends the lease after a successful heartbeat started at sent.
func (l *Leader) renew(sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil && !sent.Before(l.validUntil) {
		// The lease ran out before this beat started (the process was
		// stopped): a standby may lead already.
		l.err = ErrLeaseExpired
		close(l.lost)
	}
	if l.err != nil {
		return
	}
	l.validUntil = sent.Add(l.el.validity())
	l.expiry.Reset(time.Until(l.validUntil))
}

// lockWaitStatement begins the lock connection's wait; Wake looks for it in
// the process list.
const lockWaitStatement = "DO SLEEP"

// watch keeps the lock connection busy in DO SLEEP(LockWatch), so that its
// end (KILL, a cut connection, the server's restart) is noticed at once and
// ends leadership. A KILL QUERY of the wait (Wake, from `pause` and
// `resume`) makes the heartbeat beat at once.
func (l *Leader) watch() {
	s := l.el
	wait := s.cfg.LockWatch
	for {
		start := time.Now()
		ctx, cancel := context.WithTimeout(l.stopCtx, wait+2*s.cfg.HeartbeatInterval)
		_, err := l.conn.ExecContext(ctx, fmt.Sprintf(lockWaitStatement+"(%.3f)", wait.Seconds()))
		cancel()
		switch {
		case l.Err() != nil:
			return // released, or lost elsewhere
		case err == nil && time.Since(start) >= wait:
			// The wait ran its course.
		case err == nil || isInterrupted(err):
			// KILL QUERY ends SLEEP early, with or without an error.
			select {
			case l.wake <- struct{}{}:
			default:
			}
		case err != nil:
			l.fail(fmt.Errorf("leadership connection of relay %q: %w", s.cfg.RelayName, err))
			return
		}
	}
}

// heartbeat renews the lease every HeartbeatInterval, and at once after a
// wake, with beat.
func (l *Leader) heartbeat() {
	s := l.el
	iv := s.cfg.HeartbeatInterval
	stmt, err := l.beatConn.PrepareContext(l.stopCtx, `UPDATE outbox_relay_progress SET leader_heartbeat = NOW(6)
		WHERE relay_name = ? AND epoch = ? AND status = ? AND IS_USED_LOCK(?) = ?`)
	if err != nil {
		if l.Err() == nil {
			l.fail(fmt.Errorf("leadership heartbeat of relay %q: prepare: %w", s.cfg.RelayName, err))
		}
		return
	}
	defer stmt.Close()
	t := time.NewTimer(iv)
	defer t.Stop()
	for {
		select {
		case <-l.stopCtx.Done():
			return
		case <-l.lost:
			return
		case <-t.C:
		case <-l.wake:
			if !t.Stop() {
				<-t.C
			}
		}
		if err := l.beat(stmt); err != nil {
			if l.Err() == nil {
				l.fail(err)
			}
			return
		}
		t.Reset(iv)
	}
}

// beat writes leader_heartbeat in one statement when the epoch is still
// ours, the status is the one last read and the lock connection still
// holds the outbox table's lock (no other relay name can lead the table),
// and renews the lease. When the statement changes no row it reads the
// progress row and the lock: a newer epoch is ErrFenced; the table's lock
// not held by the lock connection ends leadership (the next Acquire finds
// out who has the table); a changed status is taken (Paused) and the beat
// repeated.
func (l *Leader) beat(stmt *sql.Stmt) error {
	s := l.el
	iv := s.cfg.HeartbeatInterval
	for range 3 {
		sent := time.Now()
		ctx, cancel := context.WithTimeout(l.stopCtx, 2*iv)
		res, err := stmt.ExecContext(ctx, s.cfg.RelayName, l.epoch, l.status, l.tableLock, l.connID)
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err == nil && n == 0 {
			var epoch, holder int64
			var status string
			err = l.beatConn.QueryRowContext(ctx, "SELECT epoch, status, COALESCE(IS_USED_LOCK(?), 0) FROM outbox_relay_progress WHERE relay_name = ?",
				l.tableLock, s.cfg.RelayName).Scan(&epoch, &status, &holder)
			switch {
			case err == nil && epoch != l.epoch:
				cancel()
				return checkpoint.ErrFenced
			case err == nil && holder != l.connID:
				cancel()
				return fmt.Errorf("leadership heartbeat of relay %q: the lock connection %d no longer holds the lock %q of outbox table %q (held by connection %d)",
					s.cfg.RelayName, l.connID, l.tableLock, s.cfg.Table, holder)
			}
			l.status = status
			l.setPaused(status == checkpoint.StatusPaused)
		}
		cancel()
		switch {
		case l.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("leadership heartbeat of relay %q: %w", s.cfg.RelayName, err)
		case n == 1:
			l.renew(sent)
			return nil
		}
	}
	return fmt.Errorf("leadership heartbeat of relay %q: the status changed at every beat", s.cfg.RelayName)
}

// isKillDenied is KILL's error for another user's connection, without
// the privilege to end it.
func isKillDenied(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1095 // ER_KILL_DENIED_ERROR
}

// isUnknownThread is KILL's error for a connection that is gone already.
func isUnknownThread(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1094 // ER_NO_SUCH_THREAD
}

// isInterrupted is a statement ended by KILL QUERY (Release does that to end
// the wait); the connection is fine.
func isInterrupted(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1317
}

// Release gives leadership up; the caller has stopped publishing under it.
// It stops the heartbeat, clears leader_instance in the progress row
// (fenced by the epoch; leader_since and leader_heartbeat stay as history)
// so `status` shows no leader and the next leader need not wait out this
// one's lease, releases the lock and closes the lock connection. Safe to
// call more than once. If the database cannot be reached, the row keeps the
// leader's name and `status` shows its heartbeat ageing past the lease; a
// later Acquire of the same Elector still knows the term is over.
func (l *Leader) Release(ctx context.Context) error {
	var err error
	l.stopOnce.Do(func() {
		l.stopHeartbeat(ctx)
		l.el.mu.Lock()
		l.el.released = l.epoch
		l.el.mu.Unlock()
		if e := l.clearLeader(ctx); e != nil {
			err = e
		}
		err = errors.Join(err, l.unlock(ctx))
	})
	return err
}

// abandon gives up leadership taken while the previous leader's lease still
// ran, before it was used: the row keeps this leader's name and heartbeat,
// so the next leader waits out this lease, which ends after the previous
// one's.
func (l *Leader) abandon(ctx context.Context) {
	l.stopOnce.Do(func() {
		l.stopHeartbeat(ctx)
		_ = l.unlock(ctx)
	})
}

// stopHeartbeat ends leadership and the heartbeat, and waits for it.
func (l *Leader) stopHeartbeat(ctx context.Context) {
	l.fail(errors.New("leadership released"))
	l.expiry.Stop()
	// End the heartbeat's wait without closing the lock connection, so
	// the lock can be released at once; if that fails, cancelling
	// closes the connection, which releases it too.
	kctx, cancel := context.WithTimeout(ctx, time.Second)
	_, _ = l.el.db.ExecContext(kctx, fmt.Sprintf("KILL QUERY %d", l.connID))
	cancel()
	l.stop()
	<-l.done
	l.beatConn.Close()
}

// unlock releases the locks (the table's first, so that a successor of
// this name never finds the table's lock still held once it has the
// name's) and closes the lock connection; when releasing failed, the
// connection is discarded rather than returned to the pool with the locks
// held. When that connection was closed under a statement (cancelling the
// heartbeat's wait does that when the wake missed it), the server holds
// the locks until the statement ends: unlock then kills the connection and
// waits until the server has let go of both locks (it releases a session's
// locks one after another), so the next leader can take them at once.
func (l *Leader) unlock(ctx context.Context) error {
	name, table := l.el.lockName(), l.tableLock
	var err error
	if table != "" {
		_, err = l.conn.ExecContext(ctx, "DO RELEASE_LOCK(?), RELEASE_LOCK(?)", table, name)
	} else {
		_, err = l.conn.ExecContext(ctx, "DO RELEASE_LOCK(?)", name)
		table = name
	}
	if err == nil {
		l.conn.Close()
		return nil
	}
	discard(l.conn)
	if !connGone(err) {
		return fmt.Errorf("release lock %q: %w (its connection is closed, which releases it)", name, err)
	}
	if _, err := l.el.db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", l.connID)); err != nil && !isUnknownThread(err) {
		return fmt.Errorf("release lock %q: end the closed lock connection %d: %w", name, l.connID, err)
	}
	for {
		var held bool
		if err := l.el.db.QueryRowContext(ctx, "SELECT COALESCE(IS_USED_LOCK(?) = ?, 0) OR COALESCE(IS_USED_LOCK(?) = ?, 0)",
			name, l.connID, table, l.connID).Scan(&held); err != nil {
			return fmt.Errorf("release lock %q: see whether the server let go of it: %w", name, err)
		}
		if !held {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("release lock %q: the server still holds it or %q for connection %d: %w", name, table, l.connID, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// discard closes conn so that database/sql drops its driver connection
// instead of returning it to the pool: the server then ends the session
// and releases any lock it holds. For a connection that may hold a lock
// after a failed statement.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// clearLeader sets leader_instance to NULL in our epoch's row. It runs on
// the pool, not the lock connection (ending the heartbeat's wait may have
// closed that one); the epoch fences it: if another process became leader
// since, the row is theirs and nothing changes.
func (l *Leader) clearLeader(ctx context.Context) error {
	if _, err := l.el.db.ExecContext(ctx, "UPDATE outbox_relay_progress SET leader_instance = NULL WHERE relay_name = ? AND epoch = ?",
		l.el.cfg.RelayName, l.epoch); err != nil {
		return fmt.Errorf("clear leader of relay %q: %w", l.el.cfg.RelayName, err)
	}
	return nil
}

// connGone is an error of a connection already closed, e.g. by cancelling
// the heartbeat's statement: closing it released the lock.
func connGone(err error) bool {
	return errors.Is(err, sql.ErrConnDone) || errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn)
}
