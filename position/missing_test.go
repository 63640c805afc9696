package position

import "testing"

// Real-world shapes of a relay's checkpoint against a server's executed set
// after a failover: several MariaDB domains and server ids (the promoted
// replica's own server id continuing a domain past the lost numbers), and
// MySQL sets of several UUIDs with interval gaps.
func TestMissing(t *testing.T) {
	const (
		u1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
		u2 = "8a94f357-aab4-11df-86ab-c80aa9429562"
	)
	for _, c := range []struct {
		name, flavor, executed, want, missing string
	}{
		{"mariadb same", FlavorMariaDB, "0-1-100", "0-1-100", ""},
		{"mariadb ahead", FlavorMariaDB, "0-1-120", "0-1-100", ""},
		{"mariadb behind", FlavorMariaDB, "0-1-90", "0-1-100", "0-1-91..0-1-100"},
		// The promoted replica (server id 2) wrote past 100 in domain 0
		// without ever having 0-1-91..100: per-domain comparison would pass.
		{"mariadb promoted replica wrote past the lost numbers", FlavorMariaDB,
			"0-1-90,0-2-130", "0-1-100", "0-1-91..0-1-100"},
		// After the failover the relay's position names the new server id:
		// the old server id's transactions are no longer compared.
		{"mariadb position on the new server id", FlavorMariaDB, "0-1-90,0-2-130", "0-2-125", ""},
		{"mariadb several domains, one short", FlavorMariaDB,
			"0-1-100,1-1-7,1-3-40,2-5-9", "0-1-100,1-3-41,2-5-9", "1-3-41..1-3-41"},
		{"mariadb several domains, two short", FlavorMariaDB,
			"0-1-99,1-3-40", "0-1-100,1-3-45", "0-1-100..0-1-100, 1-3-41..1-3-45"},
		{"mariadb domain unknown to the server", FlavorMariaDB, "0-1-100", "0-1-100,7-4-3",
			"7-4-* up to 7-4-3 (the server has no transaction of server id 4 in domain 7)"},
		{"mariadb server id unknown in the domain", FlavorMariaDB, "0-2-500", "0-1-100",
			"0-1-* up to 0-1-100 (the server has no transaction of server id 1 in domain 0)"},
		{"mariadb empty checkpoint", FlavorMariaDB, "0-1-1", "", ""},

		{"mysql same", FlavorMySQL, u1 + ":1-100", u1 + ":1-100", ""},
		{"mysql behind", FlavorMySQL, u1 + ":1-90", u1 + ":1-100", u1 + ":91-100"},
		{"mysql gaps on the server", FlavorMySQL, u1 + ":1-10:20-30:40-100", u1 + ":1-100", u1 + ":11-19:31-39"},
		{"mysql gaps in the checkpoint", FlavorMySQL, u1 + ":1-50", u1 + ":1-10:45-60", u1 + ":51-60"},
		{"mysql several uuids", FlavorMySQL, u1 + ":1-100," + u2 + ":1-5:7-9",
			u1 + ":1-100," + u2 + ":1-9", u2 + ":6"},
		{"mysql uuid unknown to the server", FlavorMySQL, u1 + ":1-100",
			u1 + ":1-100," + u2 + ":1-3", u2 + ":1-3"},
		{"mysql new uuid on the server", FlavorMySQL, u1 + ":1-100," + u2 + ":1-50", u1 + ":1-100", ""},
		// MySQL 8.3+ tagged GTIDs (uuid:tag:n): a tag's numbers are their own.
		{"mysql tagged behind", FlavorMySQL, u1 + ":1-100:relay:1-3", u1 + ":1-100:relay:1-5", u1 + ":relay:4-5"},
		{"mysql tag unknown to the server", FlavorMySQL, u1 + ":1-100", u1 + ":1-100:relay:1-2", u1 + ":relay:1-2"},
		{"mysql tagged same, untagged behind", FlavorMySQL, u1 + ":1-90:relay:1-5", u1 + ":1-100:relay:1-5", u1 + ":91-100"},
	} {
		got, err := Missing(c.flavor, c.executed, Position{Flavor: c.flavor, GTIDSet: c.want})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got != c.missing {
			t.Errorf("%s: Missing(%q, %q) = %q, want %q", c.name, c.executed, c.want, got, c.missing)
		}
	}
	if _, err := Missing(FlavorMariaDB, "0-1-x", Position{Flavor: FlavorMariaDB, GTIDSet: "0-1-1"}); err == nil {
		t.Error("a malformed server state: want an error")
	}
}

// A transaction's own GTIDs, from the commit positions before and after it.
func TestAdded(t *testing.T) {
	const u1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
	for _, c := range []struct{ flavor, prev, cur, want string }{
		{FlavorMariaDB, "0-1-100,1-1-7", "0-1-101,1-1-7", "0-1-101"},
		{FlavorMariaDB, "0-1-100,1-1-7", "0-1-100,1-3-8", "1-3-8"},
		{FlavorMariaDB, "0-1-100", "0-1-100,2-5-1", "2-5-1"},
		{FlavorMariaDB, "", "0-1-5", "0-1-5"},
		{FlavorMariaDB, "0-1-5", "0-1-5", ""},
		{FlavorMySQL, u1 + ":1-100", u1 + ":1-101", u1 + ":101"},
		{FlavorMySQL, u1 + ":1-100", u1 + ":1-100", ""},
		{FlavorMySQL, u1 + ":1-100:relay:1-4", u1 + ":1-100:relay:1-5", u1 + ":relay:5"},
	} {
		got, err := Added(c.flavor, c.prev, c.cur)
		if err != nil || got != c.want {
			t.Errorf("Added(%s, %q, %q) = %q, %v; want %q", c.flavor, c.prev, c.cur, got, err, c.want)
		}
	}
}
