package relay

import (
	"strings"
	"testing"
	"time"
)

// fakeTermPublisher is a term's publisher connected to node, waiting wait
// for confirmations.
type fakeTermPublisher struct {
	node string
	wait time.Duration
}

func (p fakeTermPublisher) Node() string               { return p.node }
func (p fakeTermPublisher) ConfirmWait() time.Duration { return p.wait }

// Ready says why the relay is not ready: not while it is a healthy standby,
// delivers (tails or polls) or holds a pause; always while its publisher
// cannot reach the broker, and while a delivering leader's confirms stall
// beyond ConfirmStallAfter (naming the node), except while paused.
// BrokerNode names the node of a leader that is not paused.
func TestUnitReady(t *testing.T) {
	stalled := fakeTermPublisher{node: "rabbit-2:5672", wait: ConfirmStallAfter + time.Second}
	for _, tc := range []struct {
		name              string
		notReady, brokerD string
		pub               termPublisher
		tailing, paused   bool
		want              string // "" ready, else a part of Ready's error
		wantNode          string
	}{
		{name: "healthy standby"},
		{name: "starting", notReady: "starting", want: "starting"},
		{name: "leading, not yet delivering", notReady: "leading, not yet delivering", want: "not yet delivering"},
		{name: "tailing", notReady: "leading, not yet delivering", tailing: true,
			pub: fakeTermPublisher{node: "rabbit-1:5672"}, wantNode: "rabbit-1:5672"},
		{name: "tailing, broker unreachable", tailing: true, brokerD: "cannot publish: connection refused", want: "connection refused"},
		{name: "tailing, confirms stalled", tailing: true, pub: stalled, want: "rabbit-2:5672", wantNode: "rabbit-2:5672"},
		{name: "paused, the publisher not yet dropped", paused: true, pub: stalled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := unitRelay(t, newFakeStore(), nil)
			r.state.setNotReady(tc.notReady)
			if tc.pub != nil {
				r.state.setPublisher(tc.pub)
			}
			r.state.setBrokerDown(tc.brokerD)
			r.tailing.Store(tc.tailing)
			r.paused.Store(tc.paused)
			err := r.Ready()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Ready: %v, want ready", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Ready: %v, want an error saying %q", err, tc.want)
			}
			if got := r.BrokerNode(); got != tc.wantNode {
				t.Fatalf("BrokerNode %q, want %q", got, tc.wantNode)
			}
			r.state.dropPublisher()
			if _, brokerDown, pub := r.state.get(); brokerDown != "" || pub != nil || r.BrokerNode() != "" {
				t.Fatalf("after the term: broker trouble %q, publisher %v", brokerDown, pub)
			}
		})
	}
}
