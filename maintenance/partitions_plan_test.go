package maintenance

import (
	"slices"
	"testing"
	"time"
)

func day(s string) time.Time {
	t, err := time.ParseInLocation("2006-01-02", s, time.UTC)
	if err != nil {
		panic(err)
	}
	return t
}

// parts builds a table's partitions: daily pYYYYMMDD ending at each bound
// (the day after the name), then pmax when withMax.
func parts(withMax bool, days ...string) []partition {
	var out []partition
	for _, d := range days {
		out = append(out, partition{name: "p" + day(d).Format("20060102"), bound: day(d).AddDate(0, 0, 1)})
	}
	if withMax {
		out = append(out, partition{name: "pmax"})
	}
	return out
}

// The plan, shared by the dry run and the real run, decided without a
// server: what is added (and split from where), what is old enough to drop.
func TestDecidePartitions(t *testing.T) {
	now := day("2026-03-10").Add(15 * time.Hour)
	for _, c := range []struct {
		name      string
		parts     []partition
		lookahead int
		retention time.Duration
		adds      []string
		maxName   string
		old       []string
	}{
		{"up to date", parts(true, "2026-03-09", "2026-03-10"), 0, 0, nil, "pmax", nil},
		{"today missing", parts(true, "2026-03-09"), 0, 0, []string{"p20260310"}, "pmax", nil},
		{"lookahead", parts(true, "2026-03-10"), 2, 0, []string{"p20260311", "p20260312"}, "pmax", nil},
		{"gap of days", parts(true, "2026-03-07"), 0, 0, []string{"p20260308", "p20260309", "p20260310"}, "pmax", nil},
		{"no MAXVALUE partition", parts(false, "2026-03-09"), 1, 0, []string{"p20260310", "p20260311"}, "", nil},
		{"only pmax", parts(true), 0, 0, []string{"p20260310"}, "pmax", nil},
		{"name taken", append(parts(false, "2026-03-09"), partition{name: "p20260310"}), 0, 0, []string{"p20260310b"}, "p20260310", nil},
		{"retention 2 days", parts(true, "2026-03-06", "2026-03-07", "2026-03-08", "2026-03-09", "2026-03-10"), 0, 48 * time.Hour,
			nil, "pmax", []string{"p20260306", "p20260307"}},
		{"retention 0 keeps all", parts(true, "2026-03-01", "2026-03-10"), 0, 0, nil, "pmax", nil},
		{"bound at the cutoff is old", parts(true, "2026-03-08", "2026-03-10"), 0, 39 * time.Hour, nil, "pmax", []string{"p20260308"}},
		{"pmax never old", parts(true), 0, time.Hour, []string{"p20260310"}, "pmax", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := decidePartitions(c.parts, now, c.lookahead, c.retention)
			var old []string
			for _, o := range p.old {
				old = append(old, o.name)
			}
			if !slices.Equal(p.added(), c.adds) || p.maxName != c.maxName || !slices.Equal(old, c.old) {
				t.Errorf("adds %v from %q, old %v; want adds %v from %q, old %v", p.added(), p.maxName, old, c.adds, c.maxName, c.old)
			}
			for _, a := range p.adds { // each holds the day its name says
				d, err := time.ParseInLocation("20060102", a.name[1:9], time.UTC)
				if err != nil || !a.bound.Equal(d.AddDate(0, 0, 1)) {
					t.Errorf("partition %s ends at %v, want the end of its day", a.name, a.bound)
				}
			}
		})
	}
}

// Old partitions holding a pending row are kept, the others dropped.
func TestSplitPending(t *testing.T) {
	old := parts(false, "2026-03-01", "2026-03-02", "2026-03-03")
	for _, c := range []struct {
		pending map[string]int64
		drop    []string
		kept    []Kept
	}{
		{nil, []string{"p20260301", "p20260302", "p20260303"}, nil},
		{map[string]int64{"p20260302": 3}, []string{"p20260301", "p20260303"}, []Kept{{"p20260302", 3}}},
		{map[string]int64{"p20260301": 1, "p20260302": 1, "p20260303": 2}, nil, []Kept{{"p20260301", 1}, {"p20260302", 1}, {"p20260303", 2}}},
	} {
		drop, kept := splitPending(old, c.pending)
		if !slices.Equal(drop, c.drop) || !slices.Equal(kept, c.kept) {
			t.Errorf("pending %v: drop %v, kept %v; want %v, %v", c.pending, drop, kept, c.drop, c.kept)
		}
	}
}
