package checkpoint

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/ordering"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func TestAppendJSONIDsSplitsRangesIntoChunks(t *testing.T) {
	in := []ordering.Range{{Lo: 1, Hi: 3}, {Lo: 7, Hi: 7}, {Lo: 10, Hi: 14}}
	orig := slices.Clone(in)
	mids := make([]outbox.MessageID, ordering.Count(in))
	mids[0][15] = 1 // the first row's message id ...01
	var got []string
	total := 0
	for rs := in; len(rs) > 0; {
		var b strings.Builder
		var n int
		rs, n = appendJSONIDs(&b, rs, mids[total:], 4)
		got = append(got, b.String())
		total += n
	}
	z := `,"00000000000000000000000000000000"]`
	want := []string{`[[1,"00000000000000000000000000000001"]` + ",[2" + z + ",[3" + z + ",[7" + z + "]", "[[10" + z + ",[11" + z + ",[12" + z + ",[13" + z + "]", "[[14" + z + "]"}
	if !slices.Equal(got, want) {
		t.Fatalf("chunks %q, want %q", got, want)
	}
	if total != ordering.Count(orig) {
		t.Fatalf("wrote %d ids, want %d", total, ordering.Count(orig))
	}
	if !slices.Equal(in, orig) {
		t.Fatalf("the caller's ranges changed: %v, want %v", in, orig)
	}
}

// truncate cuts on a rune boundary, so the result is valid UTF-8 (the
// server refuses anything else in strict mode) and a prefix of the input.
func TestTruncateCutsOnRuneBoundaries(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abcdef", 3, "abc"},
		{"xüü", 4, "xü"},         // the cut would split the second ü
		{"漢字", 4, "漢"},           // 3-byte runes
		{"😀a", 3, ""},            // a 4-byte rune that does not fit
		{"a\xffb", 4, "a\uFFFD"}, // invalid input becomes valid
		{strings.Repeat("ü", 600), 1023, strings.Repeat("ü", 511)},
	} {
		got := truncate(c.in, c.n)
		if got != c.want || !utf8.ValidString(got) || len(got) > c.n {
			t.Errorf("truncate(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// splitRanges cuts ranges into chunks of at most limit ids, splitting a
// range where needed, and leaves its input alone.
func TestSplitRangesChunksByIDs(t *testing.T) {
	in := []ordering.Range{{Lo: 1, Hi: 3}, {Lo: 7, Hi: 7}, {Lo: 10, Hi: 14}, {Lo: 20, Hi: 21}}
	orig := slices.Clone(in)
	var got [][]ordering.Range
	for rest := in; len(rest) > 0; {
		var head []ordering.Range
		head, rest = splitRanges(rest, 4)
		got = append(got, head)
	}
	want := [][]ordering.Range{{{Lo: 1, Hi: 3}, {Lo: 7, Hi: 7}}, {{Lo: 10, Hi: 13}}, {{Lo: 14, Hi: 14}, {Lo: 20, Hi: 21}}}
	if len(got) != len(want) {
		t.Fatalf("chunks %v, want %v", got, want)
	}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("chunks %v, want %v", got, want)
		}
	}
	if !slices.Equal(in, orig) {
		t.Fatalf("the caller's ranges changed: %v, want %v", in, orig)
	}
	if head, rest := splitRanges(nil, 4); head != nil || rest != nil {
		t.Fatalf("splitRanges(nil) = %v, %v", head, rest)
	}
}
