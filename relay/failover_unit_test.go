package relay

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/position"
)

// Unit tests of the failover check on a fake server (fakes_test.go).

func newUnitFailover(t *testing.T, executed string, accept bool) (*failoverCheck, *fakeServer) {
	srv := &fakeServer{executed: executed}
	return &failoverCheck{log: zaptest.NewLogger(t), server: srv, accept: accept}, srv
}

func mariaPos(gtids string) position.Position {
	return position.Position{Flavor: position.FlavorMariaDB, GTIDSet: gtids}
}

// A server that holds everything published passes; one that lacks a
// transaction of which a message was sent is refused, naming the
// transaction, how many of its messages went out, and the server.
func TestUnitFailoverCheckRefusesLoss(t *testing.T) {
	ctx := context.Background()
	f, srv := newUnitFailover(t, "0-1-6", false)
	f.startTerm(position.FlavorMariaDB)
	f.acked(mariaPos("0-1-5"))
	f.sent(sentRec("0-1-6", 1))
	f.sent(sentRec("0-1-6", 2))
	if lost, err := f.checkNotLost(ctx, position.Position{}); lost || err != nil {
		t.Fatalf("server with everything: lost %v, %v; want it accepted", lost, err)
	}
	srv.executed = "0-1-5"
	_, err := f.checkNotLost(ctx, position.Position{})
	var le *LostGTIDsError
	if !errors.As(err, &le) {
		t.Fatalf("server lacking 0-1-6: %v, want a *LostGTIDsError", err)
	}
	if le.Missing != "0-1-6..0-1-6" || le.Sent != 2 || len(le.MessageIDs) != 2 || strings.Join(le.Transactions, ",") != "0-1-6" ||
		le.Server != "replica:3306" || le.From != "published by this process" {
		t.Fatalf("refusal %+v: want 0-1-6 missing, 2 messages sent, on replica:3306, published by this process", le)
	}
	// The binlog stream's reconnect check stops the stream with it.
	var stop *canal.StopError
	if err := f.checkReconnect(ctx); !errors.As(err, &stop) || !errors.As(err, &le) {
		t.Fatalf("reconnect to the lossy server: %v, want a *canal.StopError with the *LostGTIDsError", err)
	}
}

// A process that has published nothing compares the server with the stored
// progress row; with nothing stored either there is nothing to compare.
func TestUnitFailoverCheckStoredRow(t *testing.T) {
	ctx := context.Background()
	f, _ := newUnitFailover(t, "0-1-8", false)
	if lost, err := f.checkNotLost(ctx, position.Position{}); lost || err != nil {
		t.Fatalf("nothing known: lost %v, %v", lost, err)
	}
	_, err := f.checkNotLost(ctx, mariaPos("0-1-10"))
	var le *LostGTIDsError
	if !errors.As(err, &le) || le.Missing != "0-1-9..0-1-10" ||
		!strings.Contains(le.From, "stored progress row") {
		t.Fatalf("stored 0-1-10 on a server at 0-1-8: %v, want a refusal from the stored progress row", err)
	}
}

// With Config.AcceptLostGTIDs the loss is logged and accepted: the check
// reports it (the term starts from the server's own position) and forgets
// the old history, so the next check compares with what this server has;
// a reconnect to a lossy server restarts the term instead of refusing.
func TestUnitFailoverCheckAccept(t *testing.T) {
	ctx := context.Background()
	f, _ := newUnitFailover(t, "0-1-5", true)
	f.startTerm(position.FlavorMariaDB)
	f.sent(sentRec("0-1-6", 1))
	var stop *canal.StopError
	var le *LostGTIDsError
	if err := f.checkReconnect(ctx); !errors.As(err, &stop) || errors.As(err, &le) {
		t.Fatalf("reconnect with AcceptLostGTIDs: %v, want a *canal.StopError that is no refusal", err)
	}
	lost, err := f.checkNotLost(ctx, position.Position{})
	if !lost || err != nil {
		t.Fatalf("accepted loss: lost %v, %v; want lost and no error", lost, err)
	}
	if p, _, _ := f.published.newest(); !p.IsZero() {
		t.Fatalf("after accepting, still compares with %v", p)
	}
	if lost, err := f.checkNotLost(ctx, position.Position{}); lost || err != nil {
		t.Fatalf("second check: lost %v, %v; want the server's history accepted", lost, err)
	}
}

// The state file carries what was published across a restart: a process
// started fresh with it refuses a server that lacks it, naming the file.
func TestUnitFailoverCheckStateFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.json")
	f, _ := newUnitFailover(t, "0-1-7", false)
	f.state = &stateFile{path: path, relayName: "orders"}
	if err := f.load(); err != nil {
		t.Fatalf("load without a file: %v", err)
	}
	f.startTerm(position.FlavorMariaDB)
	f.acked(mariaPos("0-1-7"))
	f.save()

	fresh, srv := newUnitFailover(t, "0-1-6", false)
	fresh.state = &stateFile{path: path, relayName: "orders"}
	if err := fresh.load(); err != nil {
		t.Fatalf("load: %v", err)
	}
	_, err := fresh.checkNotLost(ctx, mariaPos("0-1-6")) // the replicated row is behind
	var le *LostGTIDsError
	if !errors.As(err, &le) || !strings.Contains(le.From, "Config.StateFile") {
		t.Fatalf("fresh process on a server lacking 0-1-7: %v, want a refusal from the state file", err)
	}

	// The fresh process publishes more on a server that holds everything,
	// then resumes on one that lacks what the file held: the refusal still
	// names the file, and this process for what it added.
	fresh.startTerm(position.FlavorMariaDB)
	srv.executed = "0-1-8"
	if lost, err := fresh.checkNotLost(ctx, mariaPos("0-1-6")); lost || err != nil {
		t.Fatalf("fresh process on a server holding the file's position: lost %v, %v; want it accepted", lost, err)
	}
	fresh.sent(sentRec("0-1-8", 1))
	fresh.acked(mariaPos("0-1-8"))
	srv.executed = "0-1-6"
	_, err = fresh.checkNotLost(ctx, mariaPos("0-1-6"))
	if !errors.As(err, &le) || !strings.Contains(le.From, "Config.StateFile "+path) || !strings.Contains(le.From, "published by this process") {
		t.Fatalf("after publishing more, on a server lacking the file's 0-1-7: %v, want a refusal naming the state file and this process", err)
	}
	// A server lacking only what this process added: the file is not named.
	srv.executed = "0-1-7"
	_, err = fresh.checkNotLost(ctx, mariaPos("0-1-6"))
	if !errors.As(err, &le) || le.From != "published by this process" {
		t.Fatalf("on a server lacking only 0-1-8: %v (from %q), want a refusal from this process alone", err, le.From)
	}

	other := &failoverCheck{log: zaptest.NewLogger(t), server: &fakeServer{}, state: &stateFile{path: path, relayName: "billing"}}
	var cfgErr *ConfigError
	if err := other.load(); !errors.As(err, &cfgErr) {
		t.Fatalf("another relay name's state file: %v, want a *ConfigError", err)
	}
}
