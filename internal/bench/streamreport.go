package bench

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// StreamResult is the stream destination's bench (Config.StreamPartitions):
// per relay mode, beside the bare stream producer of the same run.
type StreamResult struct {
	Partitions int `json:"partitions"`
	// The bare stream producer's catch-up of the backlog into as many
	// partitions, with the same window, to the same kind of consumer.
	BareMsgsPerS Stat `json:"bare_producer_msgs_per_s"`
	// The same until the bare producer had every message confirmed.
	BarePublishedMsgsPerS Stat                        `json:"bare_producer_confirmed_msgs_per_s"`
	Modes                 map[string]StreamModeResult `json:"modes"`
}

// StreamModeResult is what one relay mode measured into the streams.
type StreamModeResult struct {
	Latency // its bare publisher is the bare stream producer, into the same streams
	// The backlog into the streams until the relay acknowledged every row
	// (each confirmed by the broker), and its ratio to the bare producer's
	// rate until every message was confirmed: the publishing work alone.
	CatchUpPublishedMsgsPerS Stat `json:"catch_up_published_msgs_per_s"`
	RatioToBarePublished     Stat `json:"ratio_to_bare_published"`
	// The backlog into the streams until a consumer reading them has
	// received every message, and its ratio to the bare producer's rate
	// (relay msgs/s ÷ bare msgs/s, which is bare time ÷ relay time).
	CatchUpMsgsPerS Stat `json:"catch_up_msgs_per_s"`
	RatioToBare     Stat `json:"ratio_to_bare"`
	// Deliveries that repeated a message by the time every one arrived
	// (0 expected: the broker drops what a restart publishes again).
	CatchUpRepeats  Stat `json:"catch_up_repeats"`
	RelayCPUSeconds Stat `json:"relay_cpu_seconds"` // the latency phase and the catch-up
	RelayPeakRSSMiB Stat `json:"relay_peak_rss_mib"`
}

// streamTable prints the stream destination's figures: a row per figure,
// a column per mode, and the bare stream producer's catch-up.
func (s *StreamResult) streamTable(w io.Writer) {
	modes := make([]string, 0, len(s.Modes))
	for m := range s.Modes {
		modes = append(modes, m)
	}
	slices.Sort(modes)
	fmt.Fprintf(w, "stream destination: %d partition streams\n\n", s.Partitions)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := modeRows(tw, modes, func(m string) StreamModeResult { return s.Modes[m] })
	latencyRows(row, func(m StreamModeResult) Latency { return m.Latency })
	row("catch-up, until published (msg/s)", "%.0f", func(m StreamModeResult) Stat { return m.CatchUpPublishedMsgsPerS })
	row("ratio to bare producer, published", "%.2f", func(m StreamModeResult) Stat { return m.RatioToBarePublished })
	row("catch-up, until received (msg/s)", "%.0f", func(m StreamModeResult) Stat { return m.CatchUpMsgsPerS })
	row("ratio to bare producer, received", "%.2f", func(m StreamModeResult) Stat { return m.RatioToBare })
	row("catch-up repeated deliveries", "%.0f", func(m StreamModeResult) Stat { return m.CatchUpRepeats })
	row("relay CPU (s)", "%.1f", func(m StreamModeResult) Stat { return m.RelayCPUSeconds })
	row("relay peak RSS (MiB)", "%.0f", func(m StreamModeResult) Stat { return m.RelayPeakRSSMiB })
	tw.Flush()
	b, p := s.BareMsgsPerS, s.BarePublishedMsgsPerS
	fmt.Fprintf(w, "\nbare stream producer, same partitions and window: %.0f msg/s [%.0f … %.0f] until confirmed, "+
		"%.0f msg/s [%.0f … %.0f] until received\n", p.Median, p.Min, p.Max, b.Median, b.Min, b.Max)
}
