package metrics

import (
	"fmt"
	"math"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Namespace prefixes every metric name: outbox_relay_….
const Namespace = "outbox_relay"

// PendingRowsCap is where the leader's count of outbox_relay_pending_rows
// stops, so one count reads a bounded number of index entries however long
// the backlog: the gauge reads PendingRowsCap for any larger backlog
// (`outbox-relay status` counts them all).
const PendingRowsCap = 100_000

// Values of the mode label of outbox_relay_mode (the relay's modes).
const (
	ModeBinlog = "binlog"
	ModePoll   = "poll"
)

// Values of the reason label of outbox_relay_publish_failures_total.
const (
	// ReasonUnroutable: the broker returned the message (basic.return, 312
	// NO_ROUTE): no queue is bound for its routing key.
	ReasonUnroutable = "unroutable"
	// ReasonExchangeNotFound: the exchange does not exist (channel closed
	// with 404 NOT_FOUND).
	ReasonExchangeNotFound = "exchange_not_found"
	// ReasonReturned: another refusal by the broker (e.g. 403 ACCESS_REFUSED).
	ReasonReturned = "returned"
	// ReasonNacked: the broker nacked the message --max-attempts times.
	ReasonNacked = "nacked"
	// ReasonBadRecord: the row cannot be published as it is (headers not a
	// flat JSON object, unsupported header value, ...).
	ReasonBadRecord = "bad_record"
	// ReasonOther: anything else; also what an unknown reason is counted as.
	ReasonOther = "other"
)

// Values of the target label of outbox_relay_reconnects_total.
const (
	TargetMySQL  = "mysql"  // the database pool or the leadership connection
	TargetBinlog = "binlog" // the binlog stream (replication connection)
	TargetAMQP   = "amqp"   // the broker connection
)

// The label values; functions rather than variables so the package has no
// mutable state.
func modes() []string { return []string{ModeBinlog, ModePoll} }
func reasons() []string {
	return []string{ReasonUnroutable, ReasonExchangeNotFound, ReasonReturned, ReasonNacked, ReasonBadRecord, ReasonOther}
}
func targets() []string { return []string{TargetMySQL, TargetBinlog, TargetAMQP} }

// LatencyBuckets returns the upper bounds (seconds) of
// outbox_relay_delivery_latency_seconds: 0.5 ms to 60 s, finest around the
// ~1 ms commit → confirm median of a healthy relay, coarser in the tail where
// only the order of magnitude matters (a broker or database outage).
func LatencyBuckets() []float64 {
	return []float64{
		0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
		0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
		1, 2.5, 5, 10, 30, 60,
	}
}

// Metrics is the relay's set of metrics. Make one with New; its methods are
// safe for concurrent use, and all of them do nothing on a nil *Metrics.
type Metrics struct {
	mode              *prometheus.GaugeVec
	leader            prometheus.Gauge
	published         prometheus.Counter
	publishFailures   *prometheus.CounterVec
	deliveryLatency   prometheus.Histogram
	lag               prometheus.Gauge
	inflightMessages  prometheus.GaugeFunc
	inflightBytes     prometheus.GaugeFunc
	pendingRows       prometheus.Gauge
	reconnects        *prometheus.CounterVec
	failedMessages    prometheus.Counter
	retentionHeadroom prometheus.Gauge
	paused            prometheus.Gauge
	pausedSeconds     prometheus.GaugeFunc
	pausedSince       atomic.Int64 // unix nanoseconds of the pause this process holds; 0 when none

	// The in-flight series are the sum of two shares: the binlog
	// pipeline's totals (SetInflight) and the poll rounds' running count
	// (AddInflight). Both may be non-zero at once: binlog mode runs poll
	// rounds for its first-start sweep and its delayed rows.
	setMessages, setBytes atomic.Int64
	addMessages, addBytes atomic.Int64

	modeMu sync.Mutex       // makes SetMode's switch of the two series atomic to scrapers
	now    func() time.Time // the clock of paused_seconds; time.Now outside tests
}

// New creates the relay's metrics and registers them with reg. A nil reg
// registers nothing (the metrics still work; nobody gathers them). The error
// is reg's, e.g. when reg already holds metrics of the same names.
//
// New does not register the Go runtime and process collectors: use
// NewRegistry for a registry that has them.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "mode",
			Help: "1 for the mode the leader delivers in (binlog: tailing the binlog; poll: the SKIP LOCKED poller), 0 for the other; all 0 on a standby.",
		}, []string{"mode"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "leader",
			Help: "1 while this instance holds leadership of its relay name, else 0.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "published_total",
			Help: "Messages the broker confirmed.",
		}),
		publishFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "publish_failures_total",
			Help: "Messages whose publication ended without a confirm, by reason (unroutable, exchange_not_found, returned, nacked, bad_record, other). Each goes to outbox_failed.",
		}, []string{"reason"}),
		deliveryLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "delivery_latency_seconds",
			Help:    "Time from the row's created_at to the broker's confirm of its message.",
			Buckets: LatencyBuckets(),
		}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "lag_seconds",
			Help: "How long the oldest row still to be delivered has been due (since created_at, or available_at for a delayed row), as last counted by the leader; 0 when no row is due, and on a standby.",
		}),
		pendingRows: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "pending_rows",
			Help: fmt.Sprintf("Rows of the outbox table not yet delivered (delayed ones included), as last counted by the leader; "+
				"the count stops at %d; 0 on a standby.", PendingRowsCap),
		}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "reconnects_total",
			Help: "Reconnections after a lost connection, by target (mysql, binlog, amqp) and, for amqp, the broker node dialled (host:port; empty for the others).",
		}, []string{"target", "node"}),
		failedMessages: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "failed_messages_total",
			Help: "Rows moved to outbox_failed (committed). Inspect them with 'outbox-relay failed list'.",
		}),
		retentionHeadroom: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "binlog_retention_headroom_seconds",
			Help: "Lower bound on the seconds until the server's binlog expiry may purge the file holding the stored position; +Inf when binlogs never expire, NaN when unknown.",
		}),
		paused: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "paused",
			Help: "1 while this instance leads a relay an operator paused and has stopped reading and publishing for it, else 0.",
		}),
		now: time.Now,
	}
	m.inflightMessages = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "inflight_messages",
		Help: "Messages read from the outbox (binlog or poll round) and not yet answered by the broker.",
	}, func() float64 { return float64(m.setMessages.Load() + m.addMessages.Load()) })
	m.inflightBytes = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "inflight_bytes",
		Help: "Bytes of the rows read from the outbox and not yet acknowledged in the database (binlog mode: at most --max-inflight-bytes).",
	}, func() float64 { return float64(m.setBytes.Load() + m.addBytes.Load()) })
	m.pausedSeconds = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "paused_seconds",
		Help: "How long this instance has held its relay paused (outbox_relay_paused 1); 0 when not paused.",
	}, func() float64 {
		since := m.pausedSince.Load()
		if since == 0 {
			return 0
		}
		return max(m.now().Sub(time.Unix(0, since)).Seconds(), 0)
	})
	for _, v := range modes() {
		m.mode.WithLabelValues(v).Set(0)
	}
	for _, v := range reasons() {
		m.publishFailures.WithLabelValues(v)
	}
	for _, v := range targets() {
		m.reconnects.WithLabelValues(v, "")
	}
	m.retentionHeadroom.Set(math.NaN()) // unknown until first computed

	if reg != nil {
		for _, c := range m.collectors() {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register relay metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.mode, m.leader, m.published, m.publishFailures, m.deliveryLatency, m.lag,
		m.inflightMessages, m.inflightBytes, m.pendingRows, m.reconnects, m.failedMessages,
		m.retentionHeadroom, m.paused, m.pausedSeconds,
	}
}

// NewRegistry returns a fresh registry holding the Go runtime and process
// collectors (go_*, process_*, and go_gc_heap_live_bytes: the heap the last
// collection kept, the figure that shows whether memory grows with the
// messages relayed) and the relay's metrics, for the daemon's /metrics.
// Tests use New with their own registry instead.
func NewRegistry() (*prometheus.Registry, *Metrics, error) {
	reg := prometheus.NewRegistry()
	live := collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)}
	if err := reg.Register(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(live))); err != nil {
		return nil, nil, fmt.Errorf("register Go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, nil, fmt.Errorf("register process collector: %w", err)
	}
	m, err := New(reg)
	if err != nil {
		return nil, nil, err
	}
	return reg, m, nil
}

// SetMode records the mode the relay now delivers in: mode's series goes to
// 1, the other to 0. "" (a standby, or between modes) sets both to 0. A mode
// other than ModeBinlog and ModePoll is a programming error and sets both to 0
// as well, so the label stays bounded.
func (m *Metrics) SetMode(mode string) {
	if m == nil {
		return
	}
	m.modeMu.Lock()
	defer m.modeMu.Unlock()
	for _, v := range modes() {
		val := 0.0
		if v == mode {
			val = 1
		}
		m.mode.WithLabelValues(v).Set(val)
	}
}

// SetLeader records whether this instance holds leadership.
func (m *Metrics) SetLeader(leader bool) {
	if m == nil {
		return
	}
	m.leader.Set(boolFloat(leader))
}

// Delivered counts one message the broker confirmed and observes its
// delivery latency, confirmedAt − createdAt (the row's created_at). A zero
// createdAt counts the message without observing a latency. A negative
// latency (clocks of the relay and the database apart) is observed as 0.
func (m *Metrics) Delivered(createdAt, confirmedAt time.Time) {
	if m == nil {
		return
	}
	m.published.Inc()
	if createdAt.IsZero() {
		return
	}
	m.deliveryLatency.Observe(max(confirmedAt.Sub(createdAt).Seconds(), 0))
}

// PublishFailed counts one message whose publication ended without a confirm
// (it goes to outbox_failed). reason is one of the Reason constants; any
// other value is counted as ReasonOther.
func (m *Metrics) PublishFailed(reason string) {
	if m == nil {
		return
	}
	m.publishFailures.WithLabelValues(knownReason(reason)).Inc()
}

// ReturnReason maps the AMQP reply code of a returned or refused message to
// its reason label: 312 NO_ROUTE → ReasonUnroutable, 404 NOT_FOUND →
// ReasonExchangeNotFound, anything else → ReasonReturned.
func ReturnReason(code int) string {
	switch code {
	case 312:
		return ReasonUnroutable
	case 404:
		return ReasonExchangeNotFound
	default:
		return ReasonReturned
	}
}

func knownReason(r string) string {
	for _, v := range reasons() {
		if r == v {
			return r
		}
	}
	return ReasonOther
}

// MessagesFailed counts n rows committed to outbox_failed. n ≤ 0 does
// nothing.
func (m *Metrics) MessagesFailed(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.failedMessages.Add(float64(n))
}

// SetLag sets outbox_relay_lag_seconds: how long, in seconds, the oldest
// row still to be delivered has been due; 0 when no row is due. A negative
// value (a row due in the future by the database's clock) is set as 0.
func (m *Metrics) SetLag(seconds float64) {
	if m == nil {
		return
	}
	m.lag.Set(max(seconds, 0))
}

// SetInflight sets the binlog pipeline's share of the in-flight series: the
// messages it read and the broker has not yet answered, and the bytes of the
// rows it read and has not yet acknowledged. SetInflight(0, 0) when the
// pipeline ends.
func (m *Metrics) SetInflight(messages int, bytes int64) {
	if m == nil {
		return
	}
	m.setMessages.Store(int64(messages))
	m.setBytes.Store(bytes)
}

// AddInflight adds to the poll rounds' share of the in-flight series
// (negative deltas when the broker has answered, or the round's transaction
// ended). Every caller takes back exactly what it added, so the share
// returns to 0 when no round is under way; it is kept apart from
// SetInflight's, so the two never overwrite each other.
func (m *Metrics) AddInflight(messages int, bytes int64) {
	if m == nil {
		return
	}
	m.addMessages.Add(int64(messages))
	m.addBytes.Add(bytes)
}

// SetPendingRows sets outbox_relay_pending_rows: the rows of the outbox
// table not yet delivered, as last counted.
func (m *Metrics) SetPendingRows(n int64) {
	if m == nil {
		return
	}
	m.pendingRows.Set(float64(n))
}

// Reconnected counts one reconnection to target (one of the Target
// constants). An unknown target is ignored, so the label stays bounded.
func (m *Metrics) Reconnected(target string) { m.ReconnectedTo(target, "") }

// ReconnectedTo counts one reconnection (or, for amqp, one dial) to target
// at node, the host:port of the broker node dialled (the nodes come from
// --amqp-url, so the label stays bounded). An unknown target is ignored.
func (m *Metrics) ReconnectedTo(target, node string) {
	if m == nil {
		return
	}
	for _, v := range targets() {
		if v == target {
			m.reconnects.WithLabelValues(target, node).Inc()
			return
		}
	}
}

// SetRetentionHeadroom sets outbox_relay_binlog_retention_headroom_seconds:
// a value from RetentionHeadroom, +Inf when the server never expires
// binlogs, NaN when unknown (e.g. in poll mode, where no stored binlog
// position is needed).
func (m *Metrics) SetRetentionHeadroom(seconds float64) {
	if m == nil {
		return
	}
	m.retentionHeadroom.Set(seconds)
}

// SetPaused records whether this instance holds its relay paused (it leads,
// an operator paused it, and it has stopped reading and publishing). The
// paused seconds count from the call that set it true.
func (m *Metrics) SetPaused(paused bool) {
	if m == nil {
		return
	}
	if paused {
		m.pausedSince.CompareAndSwap(0, m.now().UnixNano())
	} else {
		m.pausedSince.Store(0)
	}
	m.paused.Set(boolFloat(paused))
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
