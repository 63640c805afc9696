package leadership_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/leadership"
	"github.com/outbox-relay/outbox-relay/internal/mysqlconn"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// A takeover from a stopped leader ends the connections of its poll workers
// (each holds a poll lock of the relay name, as package poller's do), so the
// row locks of their open rounds are free for the new leader, and it does so
// as a user without PROCESS or CONNECTION ADMIN. A connection of the same
// user holding a row lock without a poll lock (an application's) and one
// holding a poll lock of another relay name are left alone.
func TestTakeoverEndsStalePollConnections(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	tdb := testenv.MySQL(t).Migrate(ctx, t)
	root := tdb.SQL
	user := strings.ReplaceAll(strings.TrimPrefix(tdb.Name, "t_"), "_", "")[:20]
	mustExec(ctx, t, root, fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY 'pw'", user))
	t.Cleanup(func() { _, _ = root.Exec(fmt.Sprintf("DROP USER '%s'@'%%'", user)) })
	mustExec(ctx, t, root, fmt.Sprintf("GRANT ALL ON `%s`.* TO '%s'@'%%'", tdb.Name, user))
	db := tdb.Pool(t, func(c *mysql.Config) {
		mysqlconn.UTC(c)
		c.User, c.Passwd = user, "pw"
	})
	if err := checkpoint.EnsureRow(ctx, db, "default"); err != nil {
		t.Fatal(err)
	}
	mustExec(ctx, t, db, `INSERT INTO outbox (message_id, routing_key, payload)
		VALUES (UNHEX(REPLACE(UUID(), '-', '')), 'rk', '1'), (UNHEX(REPLACE(UUID(), '-', '')), 'rk', '2')`)

	// The stopped leader: its lock, its epoch, a heartbeat past the lease.
	stale := conn(ctx, t, db)
	lockOn(ctx, t, stale, checkpoint.LockName("default"))
	mustExec(ctx, t, db, `UPDATE outbox_relay_progress SET epoch = epoch + 1, leader_instance = 'stale',
		leader_heartbeat = NOW(6) - INTERVAL 3 SECOND WHERE relay_name = 'default'`)
	// Its poll worker, inside a round: a poll lock and the head claimed.
	worker := conn(ctx, t, db)
	lockOn(ctx, t, worker, checkpoint.PollLockName("default", 5))
	round, err := worker.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer round.Rollback()
	var head int64
	if err := round.QueryRowContext(ctx, "SELECT MIN(id) FROM outbox").Scan(&head); err != nil {
		t.Fatal(err)
	}
	if _, err := round.ExecContext(ctx, "SELECT id FROM outbox WHERE id = ? FOR UPDATE", head); err != nil {
		t.Fatal(err)
	}
	// The same user's other connections: an application's transaction and
	// a poll worker of another relay name.
	app := conn(ctx, t, db)
	appTx, err := app.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer appTx.Rollback()
	if _, err := appTx.ExecContext(ctx, "SELECT id FROM outbox WHERE id > ? FOR UPDATE", head); err != nil {
		t.Fatal(err)
	}
	other := conn(ctx, t, db)
	lockOn(ctx, t, other, checkpoint.PollLockName("other", 5))

	el := newElector(t, db, leadership.Config{HeartbeatInterval: 200 * time.Millisecond, LeaderLease: 2 * time.Second, Instance: "new"})
	leader, err := el.Acquire(ctx)
	if err != nil {
		t.Fatalf("take over the stopped leader: %v", err)
	}
	defer leader.Release(context.WithoutCancel(ctx))

	// The new leader's claim finds the head free at once.
	var claimed int64
	if err := db.QueryRowContext(ctx, "SELECT id FROM outbox WHERE id = ? FOR UPDATE SKIP LOCKED", head).Scan(&claimed); err != nil {
		t.Errorf("claim the head %d the stopped worker held: %v", head, err)
	}
	if err := worker.PingContext(ctx); err == nil {
		t.Error("the stopped leader's poll connection is still open")
	}
	if err := round.Commit(); err == nil {
		t.Error("the stopped leader's round committed after the takeover")
	}
	if err := appTx.Commit(); err != nil {
		t.Errorf("the application's transaction, of the same user without a poll lock: %v", err)
	}
	if err := other.PingContext(ctx); err != nil {
		t.Errorf("the poll connection of another relay name: %v", err)
	}
}

// conn is a connection of its own from db, closed at the end of the test.
func conn(ctx context.Context, t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// lockOn takes the user lock name on c.
func lockOn(ctx context.Context, t *testing.T, c *sql.Conn, name string) {
	t.Helper()
	var got int
	if err := c.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", name).Scan(&got); err != nil || got != 1 {
		t.Fatalf("take lock %q: %d, %v", name, got, err)
	}
}
