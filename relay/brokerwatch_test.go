package relay

import (
	"testing"
	"time"
)

// A stall is a wait beyond ConfirmStallAfter on a connected publisher; a
// publisher without a node reports nothing, however long its channels wait.
func TestReportOf(t *testing.T) {
	for _, c := range []struct {
		node string
		wait time.Duration
		want brokerReport
	}{
		{"", 0, brokerReport{}},
		{"", time.Minute, brokerReport{}},
		{"127.0.0.1:5672", 0, brokerReport{node: "127.0.0.1:5672"}},
		{"127.0.0.1:5672", ConfirmStallAfter, brokerReport{node: "127.0.0.1:5672"}},
		{"127.0.0.1:5672", ConfirmStallAfter + time.Millisecond, brokerReport{node: "127.0.0.1:5672", stalled: true}},
	} {
		if got := reportOf(c.node, c.wait); got != c.want {
			t.Errorf("reportOf(%q, %v) = %+v, want %+v", c.node, c.wait, got, c.want)
		}
	}
}
