package streams

import "sync"

// EpochBits places a relay epoch's fresh publishing ids: a term of epoch e
// whose ids do not continue stored counters numbers from e<<EpochBits (or
// above the broker's last id, if higher), so its ids are above every id a
// term of an older epoch could have numbered freshly (2^40 messages per
// producer and epoch).
const EpochBits = 40

// EpochBase is the first fresh id of epoch (0 for epoch 0 and below).
func EpochBase(epoch int64) uint64 {
	if epoch <= 0 {
		return 0
	}
	return uint64(epoch) << EpochBits
}

// FreshAfter is the id after which a producer's fresh ids start: the
// highest of the broker's last id for it, the highest this process issued
// under its name (Issued) and the id below the epoch's base. Messages an
// older publisher of the same name still has on the wire (a frozen leader
// of an older epoch, an earlier term of this process) then never share an
// id with a fresh message, which the broker would drop as a duplicate.
func FreshAfter(brokerLast, issued uint64, epoch int64) uint64 {
	after := max(brokerLast, issued)
	if base := EpochBase(epoch); base > 0 {
		after = max(after, base-1)
	}
	return after
}

// Issued is the highest publishing id each producer name was given in this
// process, across Publishers (terms). Owned by the relay; safe for
// concurrent use; a nil *Issued records nothing.
type Issued struct {
	mu   sync.Mutex
	last map[string]uint64
}

// NewIssued returns an empty record.
func NewIssued() *Issued { return &Issued{} }

// Note records that id was given to a message of producer name.
func (s *Issued) Note(name string, id uint64) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		s.last = map[string]uint64{}
	}
	s.last[name] = max(s.last[name], id)
}

// Last is the highest id given under name (0 when none).
func (s *Issued) Last(name string) uint64 {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[name]
}
