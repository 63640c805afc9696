package bench

import (
	"slices"
	"time"
)

// Stat is one figure over the runs.
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func statOf(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	mid := s[len(s)/2]
	if len(s)%2 == 0 {
		mid = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stat{Median: mid, Min: s[0], Max: s[len(s)-1]}
}

// percentile of sorted durations, in milliseconds.
func percentileMs(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)) + 0.5)
	i = min(max(i-1, 0), len(sorted)-1)
	return float64(sorted[i].Microseconds()) / 1000
}
