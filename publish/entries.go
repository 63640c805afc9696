package publish

import "iter"

// entryList is a Channel's messages without a delivered Result, in publish
// order: a doubly linked list through the entries (older, newer), so that
// a message whose Result is delivered before an earlier one of another key
// leaves it at once, and what the list holds is bounded by what the
// Channel holds (MaxHeldBytes), however long an earlier message waits.
// The Channel's mu guards it.
type entryList struct {
	front, back *entry // oldest and newest; nil when empty
	n           int
}

// pushBack adds e, the newest accepted message.
func (l *entryList) pushBack(e *entry) {
	e.older, e.newer = l.back, nil
	if l.back != nil {
		l.back.newer = e
	} else {
		l.front = e
	}
	l.back = e
	l.n++
}

// remove takes e, which is in l, out of l.
func (l *entryList) remove(e *entry) {
	if e.older != nil {
		e.older.newer = e.newer
	} else {
		l.front = e.newer
	}
	if e.newer != nil {
		e.newer.older = e.older
	} else {
		l.back = e.older
	}
	e.older, e.newer = nil, nil
	l.n--
}

// len is the number of messages in l.
func (l *entryList) len() int { return l.n }

// all yields the messages of l in publish order. The loop's body must not
// remove them.
func (l *entryList) all() iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		for e := l.front; e != nil; e = e.newer {
			if !yield(e) {
				return
			}
		}
	}
}
