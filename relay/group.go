package relay

import (
	"errors"
	"sync"
)

// group owns the goroutines of one mode run of a leader term (runBinlog):
// each is started under a name with the function that asks it to stop, and
// the owner stops them by name in the order its shutdown policy says. Close
// stops and waits for every member not yet waited for, latest first: an
// early return leaves none behind.
//
// Several members may share a name (the lanes): Signal and Wait act on all
// of them. Stop functions are called at most once each. A group is used
// from its owner's goroutine only.
type group struct {
	members []*member
}

type member struct {
	name   string
	stop   sync.Once
	stopFn func()
	done   chan struct{}
	err    error
	waited bool
}

// Go runs fn in a new goroutine named name; stop (nil: nothing to do) asks
// it to return.
func (g *group) Go(name string, stop func(), fn func() error) {
	m := &member{name: name, stopFn: stop, done: make(chan struct{})}
	g.members = append(g.members, m)
	go func() {
		defer close(m.done)
		m.err = fn()
	}()
}

// Signal asks the members named name to stop, without waiting.
func (g *group) Signal(name string) {
	for _, m := range g.members {
		if m.name == name {
			m.signal()
		}
	}
}

// Wait waits until the members named name have returned, and returns their
// errors joined (nil when none failed).
func (g *group) Wait(name string) error {
	var errs []error
	for _, m := range g.members {
		if m.name == name {
			<-m.done
			m.waited = true
			errs = append(errs, m.err)
		}
	}
	return errors.Join(errs...)
}

// Stop is Signal, then Wait.
func (g *group) Stop(name string) error {
	g.Signal(name)
	return g.Wait(name)
}

// Close stops every member not yet waited for, latest started first, and
// waits for each.
func (g *group) Close() {
	for i := len(g.members) - 1; i >= 0; i-- {
		if m := g.members[i]; !m.waited {
			m.signal()
			<-m.done
			m.waited = true
		}
	}
}

func (m *member) signal() {
	m.stop.Do(func() {
		if m.stopFn != nil {
			m.stopFn()
		}
	})
}
