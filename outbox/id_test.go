package outbox

import (
	"bytes"
	"sync"
	"testing"
)

func checkV7(t *testing.T, id MessageID) {
	t.Helper()
	if v := id[6] >> 4; v != 7 {
		t.Fatalf("id %s: version nibble %d, want 7", id, v)
	}
	if v := id[8] >> 6; v != 0b10 {
		t.Fatalf("id %s: variant bits %02b, want 10", id, v)
	}
}

func TestNewIDsIncreasing(t *testing.T) {
	ids, err := newIDs(10000)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		checkV7(t, id)
		if i > 0 && bytes.Compare(ids[i-1][:], id[:]) >= 0 {
			t.Fatalf("id %d (%s) is not greater than id %d (%s)", i, id, i-1, ids[i-1])
		}
	}
}

// TestNewIDsIncreasingAcrossGoroutines checks the property Enqueue documents:
// an id is greater than every id generated before it in the process, by any
// goroutine. The test serialises "generate, then append" under its own mutex
// so that the slice order is the generation order.
func TestNewIDsIncreasingAcrossGoroutines(t *testing.T) {
	const goroutines, perG = 8, 2000
	var (
		mu  sync.Mutex
		all []MessageID
		wg  sync.WaitGroup
	)
	unordered := make([][]MessageID, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perG; i++ {
				// Unserialised: each goroutine's own ids must still increase.
				batch, err := newIDs(3)
				if err != nil {
					t.Error(err)
					return
				}
				unordered[g] = append(unordered[g], batch...)

				mu.Lock()
				id, err := newIDs(1)
				if err == nil {
					all = append(all, id[0])
				}
				mu.Unlock()
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for i := 1; i < len(all); i++ {
		if bytes.Compare(all[i-1][:], all[i][:]) >= 0 {
			t.Fatalf("generation order broken at %d: %s then %s", i, all[i-1], all[i])
		}
	}
	seen := make(map[MessageID]bool, goroutines*perG*4)
	for _, id := range all {
		seen[id] = true
	}
	for g, ids := range unordered {
		for i, id := range ids {
			checkV7(t, id)
			if i > 0 && bytes.Compare(ids[i-1][:], id[:]) >= 0 {
				t.Fatalf("goroutine %d: id %d not greater than the one before", g, i)
			}
			if seen[id] {
				t.Fatalf("duplicate id %s", id)
			}
			seen[id] = true
		}
	}
}
