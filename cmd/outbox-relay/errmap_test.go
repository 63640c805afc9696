package main

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// Every command's database errors name the fix, through the one mapping
// explainError: a wrong password, tables not migrated, a user without the
// grants of its role, an unknown relay name.
func TestCLIErrorsNameTheFix(t *testing.T) {
	bin := relayBinary(t)
	db := testenv.MySQL(t) // empty: migrate has not run
	wrongPW := strings.Replace(db.DSN, "root@", "root:wrong-pw@", 1)
	user := "nodd_" + randomHex(t, 4)
	opsExec(t, db, "CREATE USER '"+user+"'@'%' IDENTIFIED BY 'pw'")
	t.Cleanup(func() {
		if _, err := db.SQL.Exec("DROP USER IF EXISTS '" + user + "'@'%'"); err != nil {
			t.Errorf("drop MySQL user %s: %v", user, err)
		}
	})
	opsExec(t, db, "GRANT SELECT, INSERT, UPDATE, DELETE ON `"+db.Name+"`.* TO '"+user+"'@'%'")
	noDDL := strings.Replace(db.DSN, "root@", user+":pw@", 1)
	if noDDL == db.DSN || wrongPW == db.DSN {
		t.Fatalf("test DSN %q has no root@: cannot derive the other users'", db.DSN)
	}

	for _, c := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"migrate/wrong password", []string{"migrate", "--mysql-dsn", wrongPW}, 1, []string{"check the user and password"}},
		{"status/wrong password", []string{"status", "--mysql-dsn", wrongPW}, 1, []string{"check the user and password"}},
		{"status/no tables", []string{"status", "--mysql-dsn", db.DSN}, 1, []string{"run `outbox-relay migrate`"}},
		{"pause/no tables", []string{"pause", "--mysql-dsn", db.DSN}, 1, []string{"run `outbox-relay migrate`"}},
		{"failed list/no tables", []string{"failed", "list", "--mysql-dsn", db.DSN}, 1, []string{"run `outbox-relay migrate`"}},
		{"migrate/no DDL grants", []string{"migrate", "--mysql-dsn", noDDL}, 1, []string{"GRANT", "Grants per role"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runBinary(t, bin, nil, c.args...)
			ok := r.code == c.code
			for _, w := range c.want {
				ok = ok && strings.Contains(r.stderr, w)
			}
			if !ok || strings.Contains(r.stderr, "wrong-pw") {
				t.Fatalf("exit %d, want %d with %q (and no password)\nstderr: %s", r.code, c.code, c.want, r.stderr)
			}
		})
	}

	// Once migrated, an unknown relay name says no relay ran with it.
	if r := runBinary(t, bin, nil, "migrate", "--mysql-dsn", db.DSN); r.code != 0 {
		t.Fatalf("migrate: %+v", r)
	}
	r := runBinary(t, bin, nil, "checkpoint", "show", "--mysql-dsn", db.DSN, "--relay-name", "never-ran")
	if r.code != 2 || !strings.Contains(r.stderr, "no relay has run with this --relay-name yet") {
		t.Fatalf("checkpoint show of a relay that never ran: %+v", r)
	}
}
