package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Table prints the result as one table: a row per figure, a column per mode.
func (r *Result) Table(w io.Writer) {
	modes := make([]string, 0, len(r.Modes))
	for m := range r.Modes {
		modes = append(modes, m)
	}
	slices.Sort(modes)
	if len(modes) == 0 && r.Stream == nil {
		fmt.Fprintf(w, "%s\n%d runs; payload %d bytes; confirm window %d\n", r.Machine, r.Runs, r.PayloadBytes, r.Window)
	} else {
		fmt.Fprintf(w, "%s\n%d runs; latency at %.0f msg/s for %.0fs; backlog %d × %d bytes; confirm window %d\n"+
			"figures: median [min … max]\n\n", r.Machine, r.Runs, r.Rate, r.DurationS, r.Backlog, r.PayloadBytes, r.Window)
	}
	if len(r.RelayFlags) > 0 {
		fmt.Fprintf(w, "relay flags: %s\n", strings.Join(r.RelayFlags, " "))
	}
	if len(modes) > 0 {
		r.modeTable(w, modes)
	}
	if r.Stream != nil {
		r.Stream.streamTable(w)
	}
	if len(r.Shapes) > 0 {
		r.shapeTable(w)
	}
}

func (r *Result) modeTable(w io.Writer, modes []string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := modeRows(tw, modes, func(m string) ModeResult { return r.Modes[m] })
	latencyRows(row, func(m ModeResult) Latency { return m.Latency })
	row("catch-up into the queue (msg/s)", "%.0f", func(m ModeResult) Stat { return m.CatchUpMsgsPerS })
	row("ratio to bare publisher", "%.2f", func(m ModeResult) Stat { return m.RatioToBare })
	row("catch-up, live consumer (msg/s)", "%.0f", func(m ModeResult) Stat { return m.CatchUpLiveMsgsPerS })
	row("ratio to bare, live consumer", "%.2f", func(m ModeResult) Stat { return m.RatioToBareLive })
	row("catch-up repeated deliveries", "%.0f", func(m ModeResult) Stat { return m.CatchUpRepeats })
	row("live catch-up repeated deliveries", "%.0f", func(m ModeResult) Stat { return m.CatchUpLiveRepeats })
	row("idle DB queries/s", "%.2f", func(m ModeResult) Stat { return m.IdleQueriesPerS })
	row("idle, 500 scheduled waiting, DB queries/s", "%.2f", func(m ModeResult) Stat { return m.ScheduledQueriesPerS })
	row("relay CPU (s)", "%.1f", func(m ModeResult) Stat { return m.RelayCPUSeconds })
	row("relay peak RSS (MiB)", "%.0f", func(m ModeResult) Stat { return m.RelayPeakRSSMiB })
	tw.Flush()
	b, l := r.BareMsgsPerS, r.BareLiveMsgsPerS
	fmt.Fprintf(w, "\nbare amqp091 publisher, same queue and window: %.0f msg/s [%.0f … %.0f] into the queue, "+
		"%.0f msg/s [%.0f … %.0f] to a live consumer\n", b.Median, b.Min, b.Max, l.Median, l.Min, l.Max)
}

// shapeTable prints a row per shape and relay mode: catch-up msg/s beside
// the bare publisher at window 1000 and at window = keys, and the CPU
// seconds per 10,000 messages of the relay, the database server and the
// broker (0: the process is not on this machine), the bare publisher's own,
// how busy the machine's cores were, and the most deliveries that repeated a
// message in any run.
func (r *Result) shapeTable(w io.Writer) {
	fmt.Fprintf(w, "\ncatch-up shapes (into the queue, no consumer): median [min … max]; CPU in seconds per 10,000 messages\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "shape\tmode\tmsg/s\tbare w1000\tbare w=keys\tratio w1000\tratio w=keys\trelay CPU\tDB CPU\tbroker CPU\tbare w1000 broker CPU\tbare w=keys broker CPU\tbare w=keys publisher CPU\tbusy %\tbare w=keys busy %\trelay RSS MiB\trepeats (most)")
	m3 := func(format string, s Stat) string {
		return fmt.Sprintf(format+" ["+format+" … "+format+"]", s.Median, s.Min, s.Max)
	}
	for _, s := range r.Shapes {
		modes := make([]string, 0, len(s.Modes))
		for m := range s.Modes {
			modes = append(modes, m)
		}
		slices.Sort(modes)
		name := fmt.Sprintf("%s (%d keys, %d msgs)", s.Shape, s.Keys, s.Messages)
		for _, mode := range modes {
			m := s.Modes[mode]
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%.0f\t%.0f\t%.0f\n", name, mode,
				m3("%.0f", m.MsgsPerS), m3("%.0f", s.Bare1000MsgsPerS), m3("%.0f", s.BareKeysMsgsPerS),
				m3("%.2f", m.RatioToBare1000), m3("%.2f", m.RatioToBareKeys),
				m.RelayCPUPer10k.Median, m.DBCPUPer10k.Median, m.BrokerCPUPer10k.Median, s.BareBrokerCPUPer10k.Median, s.BareKeysBrokerCPUPer10k.Median,
				s.BareKeysPublisherCPUPer10k.Median, m.MachineBusyPct.Median, s.BareKeysMachineBusyPct.Median, m.RelayPeakRSSMiB.Max, m.Repeats.Max)
		}
	}
	tw.Flush()
}

// latencyRows prints the latency phase's rows (Latency) through row, for
// results R that embed it (lat).
func latencyRows[R any](row func(name, format string, get func(R) Stat), lat func(R) Latency) {
	ms := func(name string, get func(Latency) Stat) {
		row(name, "%.2f", func(m R) Stat { return get(lat(m)) })
	}
	ms("commit → receive p50 (ms)", func(l Latency) Stat { return l.LatencyP50Ms })
	ms("commit → receive p95 (ms)", func(l Latency) Stat { return l.LatencyP95Ms })
	ms("commit → receive p99 (ms)", func(l Latency) Stat { return l.LatencyP99Ms })
	ms("commit → receive max (ms)", func(l Latency) Stat { return l.LatencyMaxMs })
	ms("COMMIT duration p99 (ms)", func(l Latency) Stat { return l.CommitP99Ms })
	ms("COMMIT duration max (ms)", func(l Latency) Stat { return l.CommitMaxMs })
	ms("bare publish → receive p50 (ms)", func(l Latency) Stat { return l.BareLatencyP50Ms })
	ms("bare publish → receive p99 (ms)", func(l Latency) Stat { return l.BareLatencyP99Ms })
}

// modeRows writes the header of a table with a column per mode to tw and
// returns the function that writes a row: the figure get picks from each
// mode's result (of), as median [min … max] in format.
func modeRows[R any](tw *tabwriter.Writer, modes []string, of func(mode string) R) func(name, format string, get func(R) Stat) {
	fmt.Fprint(tw, "figure")
	for _, m := range modes {
		fmt.Fprintf(tw, "\t%s", m)
	}
	fmt.Fprintln(tw)
	return func(name, format string, get func(R) Stat) {
		fmt.Fprint(tw, name)
		for _, m := range modes {
			st := get(of(m))
			fmt.Fprintf(tw, "\t"+format+" ["+format+" … "+format+"]", st.Median, st.Min, st.Max)
		}
		fmt.Fprintln(tw)
	}
}
