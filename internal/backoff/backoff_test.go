package backoff

import (
	"testing"
	"time"
)

func TestDelayDoublesCapsAndJitters(t *testing.T) {
	lo, hi := 100*time.Millisecond, 2*time.Second
	for n := 1; n <= 10; n++ {
		ceil := min(lo<<(n-1), hi)
		for i := 0; i < 50; i++ {
			if d := Delay(lo, hi, n); d < ceil/2 || d > ceil {
				t.Fatalf("Delay(attempt %d) = %v, want in [%v, %v]", n, d, ceil/2, ceil)
			}
		}
	}
}

func TestCounterResets(t *testing.T) {
	c := Counter{Min: time.Second, Max: time.Minute}
	for i := 0; i < 5; i++ {
		c.Next()
	}
	c.Reset()
	if d := c.Next(); d < 500*time.Millisecond || d > time.Second {
		t.Fatalf("first delay after Reset = %v, want in [0.5s, 1s]", d)
	}
}
