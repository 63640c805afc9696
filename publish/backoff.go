package publish

import (
	"math/rand/v2"
	"time"
)

// backoff is a jittered exponential backoff: attempt n waits a random
// duration in [d/2, d] with d = min·2ⁿ capped at max. The jitter spreads the
// redials of many relays after a broker restart. Not safe for concurrent use;
// each goroutine that retries owns one.
type backoff struct {
	min, max time.Duration
	n        int
}

func (b *backoff) next() time.Duration {
	d := b.min
	for i := 0; i < b.n && d < b.max; i++ {
		d *= 2
	}
	if d > b.max {
		d = b.max
	}
	b.n++
	half := d / 2
	if half <= 0 {
		return d
	}
	return half + rand.N(d-half+1)
}

func (b *backoff) reset() { b.n = 0 }

// sleep waits d or until stop is closed; it reports whether d elapsed.
func sleep(d time.Duration, stop <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}
