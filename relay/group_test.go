package relay

import (
	"errors"
	"slices"
	"sync"
	"testing"
)

// A group stops its members when and in the order its owner says: Stop
// waits for the members of one name and returns their errors; Close stops
// the rest, latest started first.
func TestUnitGroupStopOrder(t *testing.T) {
	var (
		g     group
		mu    sync.Mutex
		order []string
	)
	run := func(name string, err error) {
		stop := make(chan struct{})
		g.Go(name, func() { close(stop) }, func() error {
			<-stop
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			return err
		})
	}
	laneErr := errors.New("lane 1 failed")
	run("watch", nil)
	run("lane", nil)
	run("lane", laneErr)
	run("acker", nil)
	if err := g.Stop("lane"); !errors.Is(err, laneErr) {
		t.Fatalf("Stop(lane) = %v, want the failed lane's error", err)
	}
	mu.Lock()
	if len(order) != 2 || order[0] != "lane" || order[1] != "lane" {
		t.Fatalf("after Stop(lane) returned: %v, want both lanes and nothing else", order)
	}
	mu.Unlock()
	g.Close()
	g.Close() // twice: nothing left, no stop function called again
	if want := []string{"lane", "lane", "acker", "watch"}; !slices.Equal(order, want) {
		t.Fatalf("stopped in order %v, want %v", order, want)
	}
}
