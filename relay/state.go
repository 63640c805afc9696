package relay

import "sync"

// supervisorState is what Ready and BrokerNode report of the relay between
// and during leader terms, beside the flags of what the term does
// (tailing, polling, paused). Run and the term write it, /readyz reads it;
// safe for concurrent use.
type supervisorState struct {
	mu sync.Mutex
	// notReady is why the relay is not ready when it neither leads and
	// delivers nor holds a pause ("" when a healthy standby).
	notReady string
	// brokerDown is the last failed dial of the current term's publisher
	// ("" once a dial succeeded or the term ended): it makes the relay not
	// ready even while it leads.
	brokerDown string
	// pub is the current term's publisher (nil between terms and while
	// paused): Ready asks it which node it is connected to and how long it
	// has waited for confirmations.
	pub termPublisher
}

// setNotReady records why the relay is not ready ("" for a healthy standby).
func (s *supervisorState) setNotReady(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notReady = reason
}

// setBrokerDown records the term's publisher's last failed dial ("" after
// one that succeeded).
func (s *supervisorState) setBrokerDown(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.brokerDown = reason
}

// setPublisher records the term's (new) publisher.
func (s *supervisorState) setPublisher(pub termPublisher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pub = pub
}

// dropPublisher forgets the term's publisher and its broker trouble: the
// term has ended, or holds a pause (its publisher is closed).
func (s *supervisorState) dropPublisher() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pub, s.brokerDown = nil, ""
}

// get returns the state as one snapshot.
func (s *supervisorState) get() (notReady, brokerDown string, pub termPublisher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notReady, s.brokerDown, s.pub
}
