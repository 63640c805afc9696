package relay

import (
	"context"
	"sync"
	"time"
)

// maintainWhileLeading runs Config.Maintenance for one leader term: at once,
// then every MaintenanceInterval, until ctx ends or leadership is lost
// (which also cancels a call in progress). The function it returns ends the
// term's maintenance and waits for a call in progress to return; lead
// defers it.
func (r *Relay) maintainWhileLeading(ctx context.Context, leader lease) (stop func()) {
	if r.cfg.Maintenance == nil {
		return func() {}
	}
	interval := r.cfg.MaintenanceInterval
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		select {
		case <-leader.Lost():
			cancel()
		case <-ctx.Done():
		}
	}()
	go func() {
		defer wg.Done()
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if ctx.Err() != nil {
				return
			}
			r.cfg.Maintenance(ctx)
			t.Reset(interval)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}
