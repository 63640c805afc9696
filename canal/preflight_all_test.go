package canal

import (
	"errors"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestPreflightNamesEveryFailure: a server with several wrong settings, a
// user without the replication grants and a clashing server id gets one
// error, on one line, naming each problem with its fix, in check order;
// errors.As still finds a *PreflightError (the first).
func TestPreflightNamesEveryFailure(t *testing.T) {
	srv := testenv.StartServer(t, testenv.ServerOptions{})
	root := srv.Root(t)
	db := srv.CreateDatabase(t)
	for _, q := range []string{
		"SET GLOBAL binlog_format='STATEMENT'",
		"SET GLOBAL binlog_row_image='MINIMAL'",
		"SET GLOBAL binlog_row_metadata='MINIMAL'",
	} {
		if _, err := root.ExecContext(testCtx(t), q); err != nil {
			t.Fatal(err)
		}
	}
	pool, user, _ := createUser(t, db, "")
	cfg := tailerConfig(t, db)
	cfg.ServerID = srv.ServerID()

	err := Preflight(testCtx(t), pool, cfg)
	t.Logf("%v", err)
	var all PreflightErrors
	if !errors.As(err, &all) {
		t.Fatalf("got %T %v, want PreflightErrors", err, err)
	}
	var got []string
	for _, pe := range all {
		got = append(got, pe.Check)
	}
	want := []string{CheckFormat, CheckRowImage, CheckRowMetadata, CheckReplSlave, CheckReplClient, CheckServerID}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("checks %v, want %v", got, want)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Errorf("message is not one line: %q", msg)
	}
	for _, pe := range all {
		if !strings.Contains(msg, pe.Problem) || !strings.Contains(msg, pe.Fix) {
			t.Errorf("message does not name %q with its fix", pe.Problem)
		}
	}
	if !strings.Contains(msg, "GRANT REPLICATION SLAVE ON *.* TO '"+user+"'@'%'") {
		t.Errorf("message does not give the GRANT for %s", user)
	}
	var first *PreflightError
	if !errors.As(err, &first) || first.Check != CheckFormat {
		t.Errorf("errors.As finds %v, want the binlog_format check", first)
	}
}
