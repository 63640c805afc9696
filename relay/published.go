package relay

import (
	"fmt"
	"sync"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/position"
)

// recentLimit bounds the message ids publishedLog keeps, with their
// transaction's GTID, to name what a lossy failover lost: 16 bytes each.
const recentLimit = 4096

// publishedLog is what this process has published, for the lossy-failover
// check (docs/operations.md, "Failover"). It holds:
//
//   - the union of the GTIDs of every transaction of which at least one
//     message was handed to the broker, confirmed or not, and of every
//     position acknowledged (foreign transactions included): the newest
//     published position, kept across reconnects and leader terms;
//   - the message ids of the latest such transactions (at most recentLimit),
//     each with its transaction's GTID and how many of its messages were
//     sent, to say what a lossy failover lost.
//
// The lanes call sent for every message before publishing it: a map lookup
// and an append under a mutex, no I/O. GTIDs are folded into the set later:
// at every acknowledgement (acked, on the acker's path), and by whoever asks
// for the position (the state file's take, the check's newest). A fold costs
// what was sent since the last one. All methods are safe for concurrent use.
type publishedLog struct {
	mu       sync.Mutex
	flavor   string
	set      *position.GTIDs // nil until something is known
	from     string          // where the set's content came from, for the refusal
	unfolded []string        // GTIDs sent since the last fold
	changed  bool            // the position moved since the last take
	// movedCh (capacity 1, made by moved) receives when changed is set:
	// the state file's writer waits on it.
	movedCh chan struct{}
	// loaded is the position load started the log from (the state file's)
	// and loadedFrom its source: from names only the latest source, and a
	// refusal must still name the file when what a server lacks came from it.
	loaded     position.Position
	loadedFrom string

	txns       map[string]*sentTxn // the transactions in recent, by GTID
	recent     []*sentTxn          // oldest first
	recentRows int                 // message ids held in recent
}

// sentTxn is one transaction of which messages were sent.
type sentTxn struct {
	gtid string
	sent int                // messages handed to the broker
	mids []outbox.MessageID // the first recentLimit of them
}

// sent records that rec's message is about to be handed to the broker. A
// record read without a GTID (polled, or a server without GTIDs) is not
// tracked.
func (l *publishedLog) sent(rec *outbox.Record) {
	if rec.GTID == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	tx := l.txns[rec.GTID]
	if tx == nil {
		if l.txns == nil {
			l.txns = map[string]*sentTxn{}
		}
		tx = &sentTxn{gtid: rec.GTID}
		l.txns[rec.GTID] = tx
		l.recent = append(l.recent, tx)
		l.unfolded = append(l.unfolded, rec.GTID)
		l.setChangedLocked()
	}
	tx.sent++
	if len(tx.mids) < recentLimit {
		tx.mids = append(tx.mids, rec.MessageID)
		l.recentRows++
	}
	for l.recentRows > recentLimit && len(l.recent) > 1 {
		old := l.recent[0]
		l.recentRows -= len(old.mids)
		delete(l.txns, old.gtid)
		l.recent[0] = nil
		l.recent = l.recent[1:]
	}
}

// startTerm fixes the flavor of the GTIDs a term reads. A different flavor
// than the log's (another kind of server behind the same address) starts the
// log over: its GTIDs cannot be compared.
func (l *publishedLog) startTerm(flavor string) {
	if flavor == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.flavor != "" && l.flavor != flavor {
		l.resetLocked()
	}
	l.flavor = flavor
}

// acked folds an acknowledged position into the set, and with it the GTIDs
// sent since the last fold: the acker's call, not the lanes', so that what
// the log holds follows what is in flight (sent since the last
// acknowledgement), not how long the relay has run, whether or not anything
// else (the state file, a failover check) asks for the position.
func (l *publishedLog) acked(p position.Position) error {
	if p.GTIDSet == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.flavor == "" {
		l.flavor = p.Flavor
	}
	if err := l.addLocked(p.GTIDSet, "published by this process"); err != nil {
		return err
	}
	return l.foldLocked()
}

// load starts the log from a position read elsewhere (the state file).
func (l *publishedLog) load(p position.Position, from string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.resetLocked()
	l.flavor = p.Flavor
	if err := l.addLocked(p.GTIDSet, from); err != nil {
		return err
	}
	l.changed = false // it is what the file holds
	l.loaded, l.loadedFrom = p, from
	return nil
}

// loadedLacking returns the source given to load when a server whose
// executed GTIDs are executed lacks part of the position load started the
// log from; "" when it holds it all or nothing was loaded.
func (l *publishedLog) loadedLacking(executed string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loaded.GTIDSet == "" {
		return ""
	}
	missing, err := position.Missing(l.loaded.Flavor, executed, l.loaded)
	if err != nil || missing == "" {
		return ""
	}
	return l.loadedFrom
}

// addLocked folds a GTID set into the set; from names the source when the
// set was empty.
func (l *publishedLog) addLocked(gtids, from string) error {
	if l.set == nil {
		set, err := position.NewGTIDs(l.flavor, gtids)
		if err != nil {
			return fmt.Errorf("published position %q: %w", gtids, err)
		}
		l.set, l.from = set, from
		l.setChangedLocked()
		return nil
	}
	if err := l.set.Passed(position.Position{Flavor: l.flavor, GTIDSet: gtids}); err != nil {
		return fmt.Errorf("published position %q: %w", gtids, err)
	}
	l.setChangedLocked()
	l.from = from
	return nil
}

// setChangedLocked records that the position moved since the last take,
// and says so on movedCh without waiting (one pending signal stands for
// any number of moves).
func (l *publishedLog) setChangedLocked() {
	l.changed = true
	if l.movedCh == nil {
		// Made here too: a follower that asks for it later (its
		// goroutine scheduled late) still finds the signal.
		l.movedCh = make(chan struct{}, 1)
	}
	select {
	case l.movedCh <- struct{}{}:
	default:
	}
}

// moved returns a channel that receives after the published position moved
// (take then has something to return). Signals coalesce: after a receive,
// take returns every move up to then.
func (l *publishedLog) moved() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.movedCh == nil {
		l.movedCh = make(chan struct{}, 1)
	}
	return l.movedCh
}

// foldLocked moves the GTIDs sent since the last fold into the set.
func (l *publishedLog) foldLocked() error {
	if len(l.unfolded) == 0 || l.flavor == "" {
		return nil
	}
	for _, g := range l.unfolded {
		if err := l.addLocked(g, "published by this process"); err != nil {
			return err
		}
	}
	l.unfolded = l.unfolded[:0]
	return nil
}

// newest returns the newest published position (zero when nothing is known)
// and where it came from.
func (l *publishedLog) newest() (position.Position, string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.foldLocked(); err != nil {
		return position.Position{}, "", err
	}
	if l.set == nil {
		return position.Position{}, "", nil
	}
	return position.Position{Flavor: l.flavor, GTIDSet: l.set.State()}, l.from, nil
}

// take returns the newest published position when it moved since the last
// take (ok), for the state file.
func (l *publishedLog) take() (p position.Position, ok bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.foldLocked(); err != nil {
		return position.Position{}, false, err
	}
	if !l.changed || l.set == nil {
		return position.Position{}, false, nil
	}
	l.changed = false
	return position.Position{Flavor: l.flavor, GTIDSet: l.set.State()}, true, nil
}

// lostOn returns, of the remembered transactions, those a server whose
// executed GTIDs are executed lacks: how many messages of theirs were sent
// and the message ids remembered (possibly fewer).
func (l *publishedLog) lostOn(executed string) (sent int, mids []outbox.MessageID, gtids []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, tx := range l.recent {
		missing, err := position.Missing(l.flavor, executed, position.Position{Flavor: l.flavor, GTIDSet: tx.gtid})
		if err != nil || missing == "" {
			continue
		}
		sent += tx.sent
		mids = append(mids, tx.mids...)
		gtids = append(gtids, tx.gtid)
	}
	return sent, mids, gtids
}

// reset forgets everything: after a lossy failover accepted, the server's
// own history is the reference.
func (l *publishedLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.resetLocked()
}

func (l *publishedLog) resetLocked() {
	l.set, l.from, l.changed = nil, "", false
	l.loaded, l.loadedFrom = position.Position{}, ""
	l.unfolded = nil
	l.txns, l.recent, l.recentRows = nil, nil, 0
}
