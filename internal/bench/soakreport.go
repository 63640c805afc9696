package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// SoakResult is a whole soak: one SoakModeResult per mode, in the order run.
type SoakResult struct {
	Machine      string           `json:"machine"`
	Rate         float64          `json:"rate"` // target transactions/s; 0: as fast as the machine takes
	DurationS    float64          `json:"duration_s"`
	PayloadBytes int              `json:"payload_bytes"`
	RelayFlags   []string         `json:"relay_flags,omitempty"`
	Modes        []SoakModeResult `json:"modes"`
}

// SoakModeResult is one mode's soak: each figure at the start (before the
// writers), after the first report period, at the end, and as a slope per
// million transactions published.
type SoakModeResult struct {
	Mode         string       `json:"mode"`
	Written      int64        `json:"written"`
	Published    float64      `json:"published"`
	MsgsPerS     float64      `json:"msgs_per_s"`
	CPUPerMsgUs  float64      `json:"relay_cpu_us_per_msg"` // over the whole soak
	LoadAvgStart string       `json:"load_avg_start"`
	LoadAvgEnd   string       `json:"load_avg_end"`
	Figures      []SoakFigure `json:"figures"`
	Samples      []SoakSample `json:"samples"`
}

// SoakFigure is one figure of a soak. SlopePerMillion is the least-squares
// slope of the figure over the transactions published, per million, fitted
// on the samples kept every report period (the start, before the writers,
// left out when there are at least three others).
type SoakFigure struct {
	Name            string  `json:"name"`
	Start           float64 `json:"start"`
	Warm            float64 `json:"after_first_period"`
	End             float64 `json:"end"`
	SlopePerMillion float64 `json:"slope_per_million"`
}

// soakFigures computes a mode's figures from its samples: the first taken
// before the writers started, the others one each report period.
func soakFigures(mode string, samples []SoakSample, written int64) *SoakModeResult {
	first, last := samples[0], samples[len(samples)-1]
	m := &SoakModeResult{Mode: mode, Written: written, Published: last.Published - first.Published,
		LoadAvgStart: first.LoadAvg, LoadAvgEnd: last.LoadAvg, Samples: samples}
	if d := last.ElapsedS - first.ElapsedS; d > 0 {
		m.MsgsPerS = m.Published / d
	}
	if m.Published > 0 {
		m.CPUPerMsgUs = (last.CPUSeconds - first.CPUSeconds) / m.Published * 1e6
	}
	fit := samples
	if len(samples) >= 4 {
		fit = samples[1:]
	}
	warm := samples[min(1, len(samples)-1)]
	for _, f := range []struct {
		name string
		get  func(SoakSample) float64
	}{
		{"live heap (MiB)", func(s SoakSample) float64 { return s.HeapLiveMiB }},
		{"heap alloc low point (MiB)", func(s SoakSample) float64 { return s.HeapAllocLowMiB }},
		{"RSS (MiB)", func(s SoakSample) float64 { return s.RSSMiB }},
		{"goroutines", func(s SoakSample) float64 { return s.Goroutines }},
		{"open files", func(s SoakSample) float64 { return s.OpenFiles }},
		{"relay DB connections", func(s SoakSample) float64 { return s.RelayDBConns }},
		{"server Threads_connected", func(s SoakSample) float64 { return s.ServerConns }},
	} {
		m.Figures = append(m.Figures, SoakFigure{Name: f.name, Start: f.get(first), Warm: f.get(warm), End: f.get(last),
			SlopePerMillion: slope(fit, f.get)})
	}
	m.Figures = append(m.Figures, cpuPerMessage(samples, fit))
	return m
}

// cpuPerMessage is the relay's CPU microseconds per message published: in
// each report period: the first period (Start), the second (Warm), the
// last (End), and its slope per million transactions over the
// fitted periods.
func cpuPerMessage(samples, fit []SoakSample) SoakFigure {
	per := func(a, b SoakSample) float64 {
		if b.Published <= a.Published {
			return 0
		}
		return (b.CPUSeconds - a.CPUSeconds) / (b.Published - a.Published) * 1e6
	}
	n := len(samples)
	f := SoakFigure{Name: "relay CPU per message (µs)"}
	if n >= 2 {
		f.Start, f.End = per(samples[0], samples[1]), per(samples[n-2], samples[n-1])
	}
	if n >= 3 {
		f.Warm = per(samples[1], samples[2])
	}
	var periods []SoakSample
	for i := 1; i < len(fit); i++ {
		s := fit[i]
		s.CPUSeconds = per(fit[i-1], fit[i]) // the period's figure, at its end's count
		periods = append(periods, s)
	}
	f.SlopePerMillion = slope(periods, func(s SoakSample) float64 { return s.CPUSeconds })
	return f
}

// slope is the least-squares slope of get over the samples' published
// count, per million; 0 with fewer than two distinct counts.
func slope(samples []SoakSample, get func(SoakSample) float64) float64 {
	n := float64(len(samples))
	var sx, sy, sxx, sxy float64
	for _, s := range samples {
		x, y := s.Published/1e6, get(s)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	den := n*sxx - sx*sx
	if n < 2 || den <= 1e-18 {
		return 0
	}
	return (n*sxy - sx*sy) / den
}

// printSample prints one report line: s against the previous sample kept
// (prev nil: the start).
func printSample(w io.Writer, mode string, start, s SoakSample, prev *SoakSample) {
	if w == nil {
		return
	}
	rate, cpu := 0.0, 0.0
	if prev != nil && s.ElapsedS > prev.ElapsedS {
		rate = (s.Published - prev.Published) / (s.ElapsedS - prev.ElapsedS)
		if s.Published > prev.Published {
			cpu = (s.CPUSeconds - prev.CPUSeconds) / (s.Published - prev.Published) * 1e6
		}
	}
	fmt.Fprintf(w, "soak %s %6.0fs: published %.0f (%.0f msg/s), backlog %d, live heap %.2f MiB, heap low %.2f MiB, "+
		"RSS %.1f MiB, goroutines %.0f, open files %.0f, relay DB conns %.0f, Threads_connected %.0f, CPU %.1f µs/msg, load %s\n",
		mode, s.ElapsedS, s.Published-start.Published, rate, s.Written-int64(s.Published-start.Published), s.HeapLiveMiB,
		s.HeapAllocLowMiB, s.RSSMiB, s.Goroutines, s.OpenFiles, s.RelayDBConns, s.ServerConns, cpu, s.LoadAvg)
}

// print writes the mode's summary table.
func (m *SoakModeResult) print(w io.Writer) {
	if w == nil {
		return
	}
	fmt.Fprintf(w, "\nsoak %s: %d transactions written, %.0f published (%.0f msg/s), relay CPU %.1f µs/msg; load average %s at start, %s at end\n",
		m.Mode, m.Written, m.Published, m.MsgsPerS, m.CPUPerMsgUs, m.LoadAvgStart, m.LoadAvgEnd)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tstart\tafter first period\tend\tslope per million transactions")
	for _, f := range m.Figures {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%+.3f\n", f.Name, f.Start, f.Warm, f.End, f.SlopePerMillion)
	}
	tw.Flush()
}

// Table prints every mode's summary.
func (r *SoakResult) Table(w io.Writer) {
	fmt.Fprintf(w, "%s\nsoak of %.0fs per mode, rate %s, payload %d bytes", r.Machine, r.DurationS, rateText(r.Rate), r.PayloadBytes)
	if len(r.RelayFlags) > 0 {
		fmt.Fprintf(w, ", relay flags: %s", strings.Join(r.RelayFlags, " "))
	}
	fmt.Fprintln(w)
	for i := range r.Modes {
		r.Modes[i].print(w)
	}
}

func rateText(rate float64) string {
	if rate == 0 {
		return "as fast as the machine takes"
	}
	return fmt.Sprintf("%.0f transactions/s", rate)
}
