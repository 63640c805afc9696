package testenv

import "testing"

func TestServerIDsDistinctAndBelowServers(t *testing.T) {
	seen := map[uint32]bool{}
	for range 100 {
		id := ServerID(t)
		if id < minClientServerID || id >= minAutoServerID || seen[id] {
			t.Fatalf("ServerID() = %d: want a new id in [%d, %d)", id, minClientServerID, minAutoServerID)
		}
		seen[id] = true
	}
}

// A block held by one open lock file (another test binary) is never handed
// out again until that file is closed (the binary exits).
func TestServerIDBlocksExclusive(t *testing.T) {
	dir := t.TempDir()
	first, base1, err := claimIDBlock(dir)
	if err != nil {
		t.Fatal(err)
	}
	second, base2, err := claimIDBlock(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if base1 == base2 || base1 != minClientServerID || base2 != minClientServerID+idBlockSize {
		t.Fatalf("two live claims got blocks at %d and %d: want %d and %d", base1, base2, minClientServerID, minClientServerID+idBlockSize)
	}
	first.Close()
	third, base3, err := claimIDBlock(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if base3 != base1 {
		t.Fatalf("after the first holder left, the claim got block %d: want its block %d back", base3, base1)
	}
}
