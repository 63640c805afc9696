package checkpoint

import (
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/ordering"
)

func TestAppendJSONIDsSplitsRangesIntoChunks(t *testing.T) {
	in := []ordering.Range{{Lo: 1, Hi: 3}, {Lo: 7, Hi: 7}, {Lo: 10, Hi: 14}}
	orig := slices.Clone(in)
	var got []string
	total := 0
	for rs := in; len(rs) > 0; {
		var b strings.Builder
		var n int
		rs, n = appendJSONIDs(&b, rs, 4)
		got = append(got, b.String())
		total += n
	}
	want := []string{"[1,2,3,7]", "[10,11,12,13]", "[14]"}
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
