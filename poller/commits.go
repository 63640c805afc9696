package poller

import (
	"context"
	"sync"
	"time"
)

// commits lets the workers of one Run or Drain wait for each other: a
// worker whose candidates were all held by other workers waits until one of
// them commits (which frees those partitions) rather than a whole interval.
type commits struct {
	mu sync.Mutex
	ch chan struct{} // closed and replaced at every commit
}

func newCommits() *commits { return &commits{ch: make(chan struct{})} }

// next returns a channel closed at the next commit after the call.
func (c *commits) next() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch
}

func (c *commits) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.ch)
	c.ch = make(chan struct{})
}

// waitCommit waits until commit is closed, d has passed or ctx ends; false
// when ctx ended.
func waitCommit(ctx context.Context, commit <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-commit:
		return true
	case <-t.C:
		return true
	}
}
