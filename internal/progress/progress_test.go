package progress

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitGoesOnWhileMeasureMoves(t *testing.T) {
	var n atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				n.Add(1)
			}
		}
	}()
	// Patience is a tenth of the whole wait: only moving keeps it alive.
	err := WaitPatience(context.Background(), 50*time.Millisecond, "count to 100", n.Load, func() bool { return n.Load() >= 100 })
	if err != nil {
		t.Fatalf("wait over a moving measure: %v", err)
	}
}

func TestWaitFailsWhenStill(t *testing.T) {
	began := time.Now()
	err := WaitPatience(context.Background(), 100*time.Millisecond, "never", func() int64 { return 7 }, func() bool { return false })
	var s *Stalled
	if !errors.As(err, &s) || s.Value != 7 || s.What != "never" {
		t.Fatalf("wait over a still measure returned %v, want *Stalled at 7", err)
	}
	if d := time.Since(began); d < 100*time.Millisecond {
		t.Fatalf("stalled after %v, before its patience", d)
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Wait(ctx, "cancelled", nil, func() bool { return false })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("wait on a cancelled context returned %v", err)
	}
}
