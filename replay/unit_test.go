package replay

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// The token bucket lets through at most rate messages per second over any
// second (burst a tenth of a second's worth), measured on a fake clock.
func TestLimiter(t *testing.T) {
	for _, rate := range []float64{1, 10, 250, 5000} {
		l := newLimiter(rate)
		now := time.Unix(1000, 0)
		l.now = func() time.Time { return now }
		l.sleep = func(_ context.Context, d time.Duration) error { now = now.Add(d); return nil }
		start := now
		var times []time.Time
		n := int(3 * rate)
		for range n {
			if err := l.wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			times = append(times, now)
		}
		// n messages at rate r, the first burst free: (n - burst) / r seconds.
		want := time.Duration((float64(n) - l.burst) / rate * float64(time.Second))
		if got := now.Sub(start); math.Abs(float64(got-want)) > float64(time.Millisecond) {
			t.Errorf("rate %v: %d messages took %v, want %v", rate, n, got, want)
		}
		for i := range times {
			j := i
			for j < len(times) && times[j].Sub(times[i]) < time.Second {
				j++
			}
			if j-i > int(rate+l.burst)+1 {
				t.Fatalf("rate %v: %d messages within one second from message %d", rate, j-i, i)
			}
		}
	}
	if newLimiter(0) != nil {
		t.Fatal("rate 0 must mean no limiter")
	}
	var none *limiter
	if err := none.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	l := newLimiter(1)
	l.tokens = 0
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait on an ended context: %v", err)
	}
}

func TestFraction(t *testing.T) {
	m := func(s string) position.Position { return position.Position{Flavor: "mariadb", GTIDSet: s} }
	y := func(s string) position.Position { return position.Position{Flavor: "mysql", GTIDSet: s} }
	const u = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
	for _, c := range []struct {
		flavor        string
		from, to, cur position.Position
		want          float64
	}{
		{"mariadb", m("0-1-100"), m("0-1-200"), m("0-1-150"), 0.5},
		{"mariadb", m("0-1-100,1-1-10"), m("0-1-200,1-1-110"), m("0-1-200,1-1-10"), 0.5},
		{"mariadb", m(""), m("0-1-40"), m("0-1-10"), 0.25},
		{"mariadb", m("0-1-100"), m("0-1-200"), m("0-1-300"), 1},
		{"mariadb", m("0-1-100"), m("0-1-100"), m("0-1-100"), -1},
		{"mysql", y(u + ":1-100"), y(u + ":1-200"), y(u + ":1-125"), 0.25},
		{"mysql", y(u + ":1-100"), position.Position{Flavor: "mysql", File: "b.2", Pos: 4}, position.Position{Flavor: "mysql", File: "b.1", Pos: 4}, -1},
	} {
		if got := fraction(c.flavor, c.from, c.to, c.cur); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("fraction(%s → %s at %s) = %v, want %v", c.from, c.to, c.cur, got, c.want)
		}
	}
	if eta(10*time.Second, 0.25) != 30*time.Second || eta(time.Second, -1) != -1 {
		t.Error("eta: want 30s after 10s at a quarter, -1 when unknown")
	}
}

func TestAddedGTID(t *testing.T) {
	const u = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
	for _, c := range []struct{ flavor, prev, cur, want string }{
		{"mariadb", "0-1-5,1-1-9", "0-1-5,1-1-10", "1-1-10"},
		{"mariadb", "", "0-1-1", "0-1-1"},
		{"mariadb", "0-1-5", "0-2-3", "0-2-3"},
		{"mysql", u + ":1-100", u + ":1-101", u + ":101"},
		{"mysql", u + ":1-100:102-200", u + ":1-200", u + ":101"},
		{"mysql", u + ":1-100", u + ":1-100", ""},
	} {
		if got := addedGTID(c.flavor, c.prev, c.cur); got != c.want {
			t.Errorf("addedGTID(%q → %q) = %q, want %q", c.prev, c.cur, got, c.want)
		}
	}
}

func TestFilterMatch(t *testing.T) {
	rec := &outbox.Record{PartitionKey: "k1", RoutingKey: "order.placed", MessageType: "order.placed"}
	for _, c := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{PartitionKeys: []string{"k2", "k1"}}, true},
		{Filter{PartitionKeys: []string{"k2"}}, false},
		{Filter{RoutingKeyPrefix: "order."}, true},
		{Filter{RoutingKeyPrefix: "user."}, false},
		{Filter{MessageType: "order.placed", RoutingKeyPrefix: "order"}, true},
		{Filter{MessageType: "order.paid"}, false},
	} {
		if got := c.f.match(rec); got != c.want {
			t.Errorf("%+v.match(k1, order.placed) = %v, want %v", c.f, got, c.want)
		}
	}
}

func TestValidateRefuses(t *testing.T) {
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"no start", Config{}},
		{"two starts", Config{Range: Range{FromGTID: "0-1-1", FromTime: at}}},
		{"two ends", Config{Range: Range{FromGTID: "0-1-1", ToGTID: "0-1-2", ToTime: at}}},
		{"end before start", Config{Range: Range{FromTime: at, ToTime: at.Add(-time.Second)}}},
		{"negative rate", Config{Range: Range{FromGTID: "0-1-1"}, Rate: -1}},
		{"no database", Config{MySQLDSN: "root@tcp(127.0.0.1:3306)/", Range: Range{FromGTID: "0-1-1"}}},
	} {
		if c.cfg.MySQLDSN == "" && c.name != "no start" {
			c.cfg.MySQLDSN = "root@tcp(127.0.0.1:3306)/db"
		}
		c.cfg.AMQPURL = "amqp://localhost/"
		var re *RefusedError
		if err := c.cfg.Validate(); !errors.As(err, &re) {
			t.Errorf("%s: Validate() = %v, want a *RefusedError", c.name, err)
		}
	}
	ok := Config{MySQLDSN: "root@tcp(127.0.0.1:3306)/db", AMQPURL: "amqp://localhost/", Range: Range{FromTime: at, ToTime: at}}
	if err := ok.Validate(); err != nil || ok.ServerID < minServerID || ok.ServerID >= minServerID+serverIDSpan {
		t.Fatalf("Validate() = %v, server id %d; want nil and an id in [%d, %d)", err, ok.ServerID, minServerID, minServerID+serverIDSpan)
	}
}
