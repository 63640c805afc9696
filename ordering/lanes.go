package ordering

import (
	"hash/fnv"
	"sync/atomic"
)

// Lanes assigns rows to n publishing lanes. Rows of one partition key always
// go to the same lane, so one lane's in-order publishing gives per-partition
// order; rows with an empty key carry no ordering constraint and are spread
// round-robin so they never pile up behind one hot lane.
type Lanes struct {
	n    int
	next atomic.Uint64
}

// NewLanes returns an assigner over n lanes (n < 1 is treated as 1).
func NewLanes(n int) *Lanes {
	if n < 1 {
		n = 1
	}
	return &Lanes{n: n}
}

// N is the number of lanes.
func (l *Lanes) N() int { return l.n }

// For returns the lane of a row with the given partition key.
func (l *Lanes) For(partitionKey string) int {
	if partitionKey == "" {
		return int(l.next.Add(1) % uint64(l.n))
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(partitionKey))
	return int(h.Sum32() % uint32(l.n))
}
