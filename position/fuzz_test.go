package position

import (
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// GTID sets come from operators (checkpoint set --gtid, replay --from-gtid
// and --to-gtid), from the progress row and from the server. The fuzz
// targets below hold the parsers to these properties: no panic; a set that
// parses prints as a set that parses back to the same set; what NewGTIDs
// keeps (State) is read back unchanged; a set covers itself and misses
// nothing of itself; Missing and Covers agree on every pair of sets.
// Seed corpora: testdata/fuzz/<FuzzName>/; `make fuzz` runs the targets.

// fuzzFlavor picks the flavor a fuzz input is read in.
func fuzzFlavor(b byte) string {
	if b%2 == 0 {
		return FlavorMariaDB
	}
	return FlavorMySQL
}

// maxGTIDText bounds what one fuzz input's set prints as, relative to its
// text: normalisation merges and shortens; only a UUID written without
// dashes grows (32 → 36 characters), plus the separators printing adds.
func maxGTIDText(in string) int { return 2*len(in) + 64 }

func FuzzGTIDSet(f *testing.F) {
	f.Fuzz(func(t *testing.T, flavorByte byte, s string) {
		flavor := fuzzFlavor(flavorByte)
		set, err := ParseGTIDSet(flavor, s)
		if err != nil {
			return
		}
		out := set.String()
		if len(out) > maxGTIDText(s) {
			t.Fatalf("%s %q prints as %d bytes", flavor, s, len(out))
		}
		back, err := ParseGTIDSet(flavor, out)
		if err != nil {
			t.Fatalf("%s %q prints as %q, which does not parse: %v", flavor, s, out, err)
		}
		if !back.Equal(set) {
			t.Fatalf("%s %q prints as %q, which parses to another set %q", flavor, s, out, back.String())
		}

		g, err := NewGTIDs(flavor, s)
		if err != nil {
			// NewGTIDs also reads every GTID of a MariaDB list, several of
			// one domain included: it may be stricter than go-mysql.
			return
		}
		state := g.State()
		if len(state) > maxGTIDText(s) {
			t.Fatalf("%s %q: State is %d bytes", flavor, s, len(state))
		}
		g2, err := NewGTIDs(flavor, state)
		if err != nil {
			t.Fatalf("%s %q: State %q does not read back: %v", flavor, s, state, err)
		}
		if again := g2.State(); again != state {
			t.Fatalf("%s %q: State %q reads back as %q", flavor, s, state, again)
		}
		self := Position{Flavor: flavor, GTIDSet: s}
		if ok, err := g.Covers(self); err != nil || !ok {
			t.Fatalf("%s %q does not cover itself: %v, %v", flavor, s, ok, err)
		}
		if ok, err := g2.Covers(self); err != nil || !ok {
			t.Fatalf("%s %q: its State %q does not cover it: %v, %v", flavor, s, state, ok, err)
		}
		if m, err := Missing(flavor, state, self); err != nil || m != "" {
			t.Fatalf("%s %q: Missing from its own State %q: %q, %v", flavor, s, state, m, err)
		}
		if a, err := Added(flavor, s, s); err != nil || a != "" {
			t.Fatalf("%s %q: Added to itself: %q, %v", flavor, s, a, err)
		}
	})
}

// FuzzMissing: whatever two sets an operator or a server gives, Missing and
// Covers agree (nothing missing exactly when the executed set covers the
// checkpoint), and on MySQL what is missing is part of the checkpoint and
// none of the executed set.
func FuzzMissing(f *testing.F) {
	f.Fuzz(func(t *testing.T, flavorByte byte, executed, want string) {
		flavor := fuzzFlavor(flavorByte)
		pos := Position{Flavor: flavor, GTIDSet: want}
		m, err := Missing(flavor, executed, pos)
		if err != nil {
			return
		}
		if len(m) > 8*(len(executed)+len(want))+256 {
			t.Fatalf("%s executed %q, want %q: Missing is %d bytes", flavor, executed, want, len(m))
		}
		g, err := NewGTIDs(flavor, executed)
		if err != nil {
			return
		}
		covered, err := g.Covers(pos)
		if err != nil {
			return
		}
		if covered != (m == "") {
			t.Fatalf("%s executed %q, want %q: Covers %v but Missing %q", flavor, executed, want, covered, m)
		}
		if flavor != FlavorMySQL || m == "" {
			return
		}
		missing, err := ParseGTIDSet(flavor, m)
		if err != nil {
			t.Fatalf("mysql executed %q, want %q: Missing %q does not parse: %v", executed, want, m, err)
		}
		wantSet, _ := ParseGTIDSet(flavor, want)
		if !wantSet.Contain(missing) {
			t.Fatalf("mysql executed %q, want %q: Missing %q is not part of the checkpoint", executed, want, m)
		}
		for sid, tags := range *missing.(*mysql.MysqlGTIDSet) {
			for tag, ivs := range tags {
				for _, iv := range ivs {
					for _, gno := range []int64{iv.Start, iv.Stop - 1} {
						if g.HasMySQL(sid, tag, gno) {
							t.Fatalf("mysql executed %q, want %q: Missing %q names %s:%s:%d, which the server has",
								executed, want, m, sid, tag, gno)
						}
					}
				}
			}
		}
	})
}
