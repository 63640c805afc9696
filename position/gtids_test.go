package position

import (
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/google/uuid"
)

func mustGTIDs(t *testing.T, flavor, set string) *GTIDs {
	t.Helper()
	g, err := NewGTIDs(flavor, set)
	if err != nil {
		t.Fatalf("NewGTIDs(%s, %q): %v", flavor, set, err)
	}
	return g
}

func covers(t *testing.T, g *GTIDs, set string) bool {
	t.Helper()
	ok, err := g.Covers(Position{Flavor: g.flavor, GTIDSet: set})
	if err != nil {
		t.Fatalf("Covers(%q): %v", set, err)
	}
	return ok
}

// A MariaDB position of three domains, then transactions of a second server
// id in domain 0 with sequence numbers below the first's (two primaries
// writing one domain, gtid_strict_mode=OFF), and a jump in the numbers.
func TestGTIDsMariaDB(t *testing.T) {
	g := mustGTIDs(t, FlavorMariaDB, "0-1-100,1-2-5,2-3-7")
	for _, c := range []struct {
		d, s uint32
		n    uint64
		want bool
	}{
		{0, 1, 100, true}, {0, 1, 1, true}, {0, 1, 101, false},
		{0, 2, 50, false}, // another server id of domain 0: not seen, however low
		{1, 2, 5, true}, {1, 2, 6, false}, {1, 1, 1, false},
		{2, 3, 7, true}, {3, 1, 1, false}, // a domain the position does not name
	} {
		if got := g.HasMariaDB(c.d, c.s, c.n); got != c.want {
			t.Errorf("start 0-1-100,1-2-5,2-3-7: HasMariaDB(%d-%d-%d) = %v, want %v", c.d, c.s, c.n, got, c.want)
		}
	}

	g.AddMariaDB(0, 2, 50)
	if !g.HasMariaDB(0, 2, 50) || !g.HasMariaDB(0, 2, 49) || g.HasMariaDB(0, 2, 51) || !g.HasMariaDB(0, 1, 100) {
		t.Error("after 0-2-50: want 0-2-49, 0-2-50 and 0-1-100 seen, 0-2-51 not")
	}
	// The position keeps one GTID per domain, the last applied.
	if got, want := g.String(), "0-2-50,1-2-5,2-3-7"; got != want {
		t.Errorf("position after 0-2-50 = %q, want %q", got, want)
	}
	g.AddMariaDB(0, 1, 101)
	g.AddMariaDB(0, 1, 110) // a gap: 102..109 never written
	if !g.HasMariaDB(0, 1, 105) || g.HasMariaDB(0, 1, 111) || !g.HasMariaDB(0, 2, 50) {
		t.Error("after 0-1-101 and 0-1-110: want 0-1-105 and 0-2-50 seen, 0-1-111 not")
	}
	if got, want := g.String(), "0-1-110,1-2-5,2-3-7"; got != want {
		t.Errorf("position = %q, want %q", got, want)
	}
	if set := g.Set().String(); set != g.String() {
		t.Errorf("Set() = %q, String() = %q", set, g.String())
	}

	if !covers(t, g, "0-1-110,1-2-5") || !covers(t, g, "0-2-50") || !covers(t, g, "") {
		t.Error("Covers: want true for 0-1-110,1-2-5, for 0-2-50 and for the empty position")
	}
	if covers(t, g, "0-2-51") || covers(t, g, "0-1-110,2-3-8") || covers(t, g, "5-1-1") {
		t.Error("Covers: want false for 0-2-51, 0-1-110,2-3-8 and 5-1-1")
	}

	// Passed: Commit positions in order, as the tailer hands them over.
	for _, p := range []string{"0-2-51,1-2-5,2-3-7", "0-2-51,1-2-6,2-3-7", "0-1-111,1-2-6,2-3-7"} {
		if err := g.Passed(Position{Flavor: FlavorMariaDB, GTIDSet: p}); err != nil {
			t.Fatal(err)
		}
	}
	if !g.HasMariaDB(0, 2, 51) || !g.HasMariaDB(1, 2, 6) || !g.HasMariaDB(0, 1, 111) || g.String() != "0-1-111,1-2-6,2-3-7" {
		t.Errorf("after Passed: position %q, want 0-1-111,1-2-6,2-3-7 with 0-2-51 seen", g.String())
	}
}

// @@gtid_binlog_state names every server id of a domain; each counts.
func TestGTIDsMariaDBState(t *testing.T) {
	g := mustGTIDs(t, FlavorMariaDB, "0-1-100,0-2-50,1-1-3")
	if !g.HasMariaDB(0, 1, 100) || !g.HasMariaDB(0, 2, 50) || g.HasMariaDB(0, 2, 51) || g.HasMariaDB(0, 3, 1) {
		t.Error("state 0-1-100,0-2-50,1-1-3: want 0-1-100 and 0-2-50 seen, 0-2-51 and 0-3-1 not")
	}
	if !covers(t, g, "0-1-100,0-2-50") || covers(t, g, "0-1-100,0-2-51") {
		t.Error("Covers on a state: want 0-1-100,0-2-50 covered, 0-1-100,0-2-51 not")
	}
	if got, want := g.String(), "0-2-50,1-1-3"; got != want {
		t.Errorf("position of state = %q, want %q (the last GTID of each domain)", got, want)
	}

	empty := mustGTIDs(t, FlavorMariaDB, "")
	if empty.HasMariaDB(0, 1, 1) || empty.String() != "" {
		t.Error("empty set: want nothing seen and an empty position")
	}
	empty.AddMariaDB(0, 7, 1)
	if !empty.HasMariaDB(0, 7, 1) || empty.String() != "0-7-1" {
		t.Errorf("empty + 0-7-1: position %q", empty.String())
	}
	if _, err := NewGTIDs(FlavorMariaDB, "0-1"); err == nil {
		t.Error("NewGTIDs(0-1): want an error")
	}
}

// A MySQL executed set with several server UUIDs, gaps in the intervals and
// a tagged GTID (MySQL 8.4).
func TestGTIDsMySQL(t *testing.T) {
	a := uuid.MustParse("3e11fa47-71ca-11e1-9e33-c80aa9429562")
	b := uuid.MustParse("8f3c5a2e-1d2b-11ef-8b0d-0242ac120002")
	c := uuid.MustParse("c0ffee00-0000-4000-8000-000000000001")
	tag := mysql.NewTag("batch")
	g := mustGTIDs(t, FlavorMySQL, a.String()+":1-5:7-10,"+b.String()+":1-100:batch:1-3")
	for _, tc := range []struct {
		sid  uuid.UUID
		tag  mysql.Tag
		gno  int64
		want bool
	}{
		{a, mysql.Tag{}, 1, true}, {a, mysql.Tag{}, 5, true}, {a, mysql.Tag{}, 6, false}, // the gap
		{a, mysql.Tag{}, 7, true}, {a, mysql.Tag{}, 10, true}, {a, mysql.Tag{}, 11, false},
		{b, mysql.Tag{}, 100, true}, {b, mysql.Tag{}, 101, false},
		{b, tag, 2, true}, {b, tag, 4, false}, {a, tag, 1, false},
		{c, mysql.Tag{}, 1, false},
	} {
		if got := g.HasMySQL(tc.sid, tc.tag, tc.gno); got != tc.want {
			t.Errorf("HasMySQL(%s:%s:%d) = %v, want %v", tc.sid, tc.tag, tc.gno, got, tc.want)
		}
	}
	g.AddMySQL(a, mysql.Tag{}, 6)
	g.AddMySQL(c, mysql.Tag{}, 1)
	if !g.HasMySQL(a, mysql.Tag{}, 6) || !g.HasMySQL(c, mysql.Tag{}, 1) {
		t.Error("after adding a:6 and c:1: want both seen")
	}
	want := a.String() + ":1-10," + b.String() + ":1-100:batch:1-3," + c.String() + ":1"
	if got := g.String(); got != want {
		t.Errorf("set = %q, want %q", got, want)
	}
	if !covers(t, g, a.String()+":2-9,"+c.String()+":1") || covers(t, g, a.String()+":1-11") {
		t.Error("Covers: want a:2-9,c:1 covered and a:1-11 not")
	}
	if err := g.Passed(Position{Flavor: FlavorMySQL, GTIDSet: a.String() + ":1-12"}); err != nil {
		t.Fatal(err)
	}
	if !g.HasMySQL(a, mysql.Tag{}, 12) || !g.HasMySQL(b, mysql.Tag{}, 50) {
		t.Error("after Passed a:1-12: want a:12 and b:50 seen")
	}
}

// GTIDs of the other flavor are never seen and change nothing.
func TestGTIDsOtherFlavor(t *testing.T) {
	maria := mustGTIDs(t, FlavorMariaDB, "0-1-5")
	sid := uuid.MustParse("3e11fa47-71ca-11e1-9e33-c80aa9429562")
	maria.AddMySQL(sid, mysql.Tag{}, 1)
	if maria.HasMySQL(sid, mysql.Tag{}, 1) || maria.String() != "0-1-5" {
		t.Errorf("a MariaDB set took a MySQL GTID: %q", maria.String())
	}
	my := mustGTIDs(t, FlavorMySQL, sid.String()+":1-3")
	my.AddMariaDB(0, 1, 1)
	if my.HasMariaDB(0, 1, 1) || my.String() != sid.String()+":1-3" {
		t.Errorf("a MySQL set took a MariaDB GTID: %q", my.String())
	}
}
