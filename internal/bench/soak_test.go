package bench

import (
	"math"
	"testing"
)

// TestSoakFigures checks the soak's arithmetic on made-up samples: a live
// heap growing by 2 MiB per million transactions published, a flat RSS,
// and a CPU cost per message that doubles halfway.
func TestSoakFigures(t *testing.T) {
	var samples []SoakSample
	cpu := 0.0
	for i := 0; i <= 10; i++ {
		published := float64(i) * 100_000
		if i > 0 {
			per := 100e-6 // seconds per message
			if i > 5 {
				per = 200e-6
			}
			cpu += per * 100_000
		}
		samples = append(samples, SoakSample{ElapsedS: float64(i) * 60, Published: published,
			HeapLiveMiB: 3 + 2*published/1e6, RSSMiB: 30, CPUSeconds: cpu})
	}
	m := soakFigures("binlog", samples, 1_000_000)
	got := map[string]SoakFigure{}
	for _, f := range m.Figures {
		got[f.Name] = f
	}
	near := func(name string, v, want float64) {
		t.Helper()
		if math.Abs(v-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	near("live heap slope", got["live heap (MiB)"].SlopePerMillion, 2)
	near("live heap end", got["live heap (MiB)"].End, 5)
	near("RSS slope", got["RSS (MiB)"].SlopePerMillion, 0)
	cpuFig := got["relay CPU per message (µs)"]
	near("CPU first period", cpuFig.Start, 100)
	near("CPU last period", cpuFig.End, 200)
	near("CPU over the soak", m.CPUPerMsgUs, 150)
	if cpuFig.SlopePerMillion <= 0 {
		t.Errorf("CPU per message slope %v, want positive (the cost doubled)", cpuFig.SlopePerMillion)
	}
	near("msg/s", m.MsgsPerS, 1_000_000/600.0)
}
