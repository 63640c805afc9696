package main

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// status names the RabbitMQ node the leader publishes to (here a proxy in
// front of the broker, as a load balancer would be), says when the broker
// has stopped confirming the messages on the wire (the proxy made a black
// hole) and since when, clears that once confirms come again, and names no
// node after a clean stop.
func TestCLIStatusBroker(t *testing.T) {
	t.Parallel() // a server of its own (privateDB); mostly waits for the stall to show
	ctx := testenv.WorkContext(t)
	db := privateDB(t)
	b := testenv.RabbitMQ(t)
	migrate(t, db.DSN)
	amqpURL, err := url.Parse(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.Proxy(t, amqpURL.Host)
	amqpURL.Host = proxy.Addr()
	// A heartbeat of a minute: the client gives a silent connection up
	// after one and a half (three half-intervals), not after 15 s (the
	// default 10 s heartbeat), so a busy machine's status polls still find
	// the stall, which status shows after 10 s, before the connection ends.
	amqpURL.RawQuery = "heartbeat=60"
	p := newRelayProc(t, relayArgs(t, db, b, append(leaderFlags(), "--amqp-url", amqpURL.String())...)...)
	p.start()
	defer p.kill()
	p.waitLog(ctx, "tailing the binlog")

	insertPending(t, db, 1)
	s := waitStatus(ctx, t, db, "the node and the row delivered", func(s statusJSON) bool {
		return s.PendingRows == 0 && s.Broker != nil && s.Broker.Node == proxy.Addr()
	})
	if s.Broker.ConfirmsStalled != nil {
		t.Fatalf("a broker that confirms shown stalled: %+v", s.Broker.ConfirmsStalled)
	}
	if r := ops(t, db, "status"); r.code != 0 || !strings.Contains(r.stdout, "broker              "+proxy.Addr()+"\n") {
		t.Fatalf("status table names no broker node:\n%+v", r)
	}

	// The broker goes silent with messages on the wire.
	proxy.Stall()
	stalledAt := time.Now()
	insertPending(t, db, 3)
	s = waitStatus(ctx, t, db, "confirms stalled", func(s statusJSON) bool {
		return s.Broker != nil && s.Broker.ConfirmsStalled != nil
	})
	st := s.Broker.ConfirmsStalled
	if s.Broker.Node != proxy.Addr() || st.Since == nil || st.Seconds < 10 ||
		st.Since.Before(stalledAt.Add(-time.Second)) || s.PendingRows != 3 {
		t.Fatalf("stalled broker: node %q, %+v, since %v (stalled at %v), %d pending", s.Broker.Node, st, st.Since, stalledAt.UTC(), s.PendingRows)
	}
	r := ops(t, db, "status")
	if r.code != 0 || !strings.Contains(r.stdout, "broker              "+proxy.Addr()+", no publisher confirms for ") {
		t.Fatalf("status table does not say the confirms stopped:\n%+v", r)
	}
	t.Logf("status while the broker is silent:\n%s", r.stdout)

	// Confirms come again: the stall is gone, the rows delivered.
	proxy.Unstall()
	waitStatus(ctx, t, db, "confirms again", func(s statusJSON) bool {
		return s.PendingRows == 0 && s.Broker != nil && s.Broker.Node == proxy.Addr() && s.Broker.ConfirmsStalled == nil
	})

	if code, _ := p.terminate(time.Minute); code != 0 {
		t.Fatalf("SIGTERM: exit code %d", code)
	}
	if s := statusOf(t, db); s.Broker != nil || s.Leader != nil {
		t.Fatalf("after a clean stop: broker %+v, leader %+v", s.Broker, s.Leader)
	}
	if r := ops(t, db, "status"); r.code != 0 || !strings.Contains(r.stdout, "broker              none") {
		t.Fatalf("status table after a clean stop:\n%+v", r)
	}
}

// The broker line: none, a node, a node whose confirms stopped.
func TestBrokerText(t *testing.T) {
	since := time.Date(2026, 11, 25, 4, 40, 0, 0, time.UTC)
	for _, c := range []struct {
		b    *brokerJSON
		want string
	}{
		{nil, "none (not connected, or no leader)"},
		{&brokerJSON{Node: "127.0.0.1:5673"}, "127.0.0.1:5673"},
		{&brokerJSON{Node: "rabbit-2:5672", ConfirmsStalled: &failedStatusJSON{Since: &since, Seconds: 25.4}},
			"rabbit-2:5672, no publisher confirms for 25s (since " + utcText(since) + "; the messages are held, not given up)"},
		{&brokerJSON{Node: "rabbit-2:5672", ConfirmsStalled: &failedStatusJSON{Seconds: 11}},
			"rabbit-2:5672, no publisher confirms for 11s (since ?; the messages are held, not given up)"},
	} {
		if got := brokerText(c.b); got != c.want {
			t.Errorf("brokerText(%+v) = %q, want %q", c.b, got, c.want)
		}
	}
}
