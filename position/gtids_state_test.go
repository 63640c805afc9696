package position

import "testing"

// State is the union of what was fed, whatever the order: a lower sequence
// number added after a higher one of the same server does not hide it, and
// every server id of a domain is listed.
func TestGTIDsStateIsOrderFree(t *testing.T) {
	g, err := NewGTIDs(FlavorMariaDB, "0-1-5")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"0-1-9", "1-1-3", "0-1-7", "0-2-4"} {
		if err := g.Passed(Position{Flavor: FlavorMariaDB, GTIDSet: p}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := g.State(), "0-1-9,0-2-4,1-1-3"; got != want {
		t.Fatalf("State() = %q, want %q", got, want)
	}
	if missing, err := Missing(FlavorMariaDB, "0-1-8,0-2-4,1-1-3", Position{Flavor: FlavorMariaDB, GTIDSet: g.State()}); err != nil || missing != "0-1-9..0-1-9" {
		t.Fatalf("Missing = %q, %v; want 0-1-9..0-1-9", missing, err)
	}

	m, err := NewGTIDs(FlavorMySQL, "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Passed(Position{Flavor: FlavorMySQL, GTIDSet: "3e11fa47-71ca-11e1-9e33-c80aa9429562:7"}); err != nil {
		t.Fatal(err)
	}
	if got, want := m.State(), "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7"; got != want {
		t.Fatalf("MySQL State() = %q, want %q", got, want)
	}
}
