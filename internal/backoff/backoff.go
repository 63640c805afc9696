package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Delay is the wait before retry attempt n (1-based): d = lo·2ⁿ⁻¹ capped at
// hi, then a random duration in [d/2, d].
func Delay(lo, hi time.Duration, n int) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	half := d / 2
	if half <= 0 {
		return d
	}
	return half + rand.N(d-half+1)
}

// Counter is Delay with its own attempt count; reset it after a success.
// Not safe for concurrent use: each retrying goroutine owns one.
type Counter struct {
	Min, Max time.Duration
	n        int
}

// Next counts an attempt and returns its delay.
func (c *Counter) Next() time.Duration {
	c.n++
	return Delay(c.Min, c.Max, c.n)
}

// Reset starts the count over.
func (c *Counter) Reset() { c.n = 0 }

// Sleep waits d, or less when ctx ends first; it reports whether d elapsed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
