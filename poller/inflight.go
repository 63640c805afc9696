package poller

import (
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// inflight is one round's share of outbox_relay_inflight_messages and
// outbox_relay_inflight_bytes (metrics.AddInflight): its messages from their
// publication until the broker has answered them all, its rows' bytes until
// its transaction ends. Whatever it added it takes back, so the series
// return to 0 when no round is under way.
type inflight struct {
	m     *metrics.Metrics
	msgs  int
	bytes int64
}

// startInflight counts recs in flight; the round is about to publish them.
func startInflight(m *metrics.Metrics, recs []*outbox.Record) *inflight {
	f := &inflight{m: m, msgs: len(recs)}
	for _, r := range recs {
		f.bytes += int64(r.Size())
	}
	m.AddInflight(f.msgs, f.bytes)
	return f
}

// answered takes the messages back: the broker has answered every one (or
// the round gave up waiting).
func (f *inflight) answered() {
	f.m.AddInflight(-f.msgs, 0)
	f.msgs = 0
}

// end takes back what is left: the round's transaction committed or rolled
// back.
func (f *inflight) end() {
	f.m.AddInflight(-f.msgs, -f.bytes)
	f.msgs, f.bytes = 0, 0
}
