package relay

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// brokerEvery is how often a leader looks at its publisher (in memory) for
// a change of RabbitMQ node or of confirm stall to record.
const brokerEvery = time.Second

// brokerReport is what the progress row says of the broker: the node
// ("" none) and whether its confirms have stalled.
type brokerReport struct {
	node    string
	stalled bool
}

// reportOf is the report for a publisher connected to node ("" when not
// connected, or no publisher) that has waited wait for confirmations: a
// stall is a wait beyond ConfirmStallAfter on a connected publisher, as
// Ready reports it.
func reportOf(node string, wait time.Duration) brokerReport {
	return brokerReport{node: node, stalled: node != "" && wait > ConfirmStallAfter}
}

// watchBroker records in the progress row, fenced by leader's epoch, the
// RabbitMQ node the term's publisher is connected to and whether its
// confirms have stalled (checkpoint.Store.SetBroker), for `status`. It looks
// at the publisher in memory every brokerEvery and writes only on a change,
// so an idle relay adds no statement (one at the start of a term). stop ends the goroutine and clears
// both columns: a row without a leader names no broker.
func (r *Relay) watchBroker(ctx context.Context, leader lease) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	// Unknown at the start of a term: the row may hold a dead leader's
	// report, so the first look writes whatever it finds.
	written := brokerReport{node: "?"}
	write := func(ctx context.Context, rep brokerReport, wait time.Duration) {
		if !rep.stalled {
			wait = 0
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := r.store.SetBroker(wctx, leader.Epoch(), rep.node, wait)
		switch {
		case err == nil:
			written = rep
		case errors.Is(err, checkpoint.ErrFenced) || ctx.Err() != nil:
			// Another leader's row, or the term is ending: its own
			// watcher, or the next term's, writes.
		default:
			r.log.Debug("cannot record the RabbitMQ node in the progress row; trying again", zap.Error(err))
		}
	}
	go func() {
		defer close(done)
		t := time.NewTicker(brokerEvery)
		defer t.Stop()
		for {
			var (
				node string
				wait time.Duration
			)
			if _, _, pub := r.state.get(); pub != nil && !r.Paused() {
				node, wait = pub.Node(), pub.ConfirmWait()
			}
			if rep := reportOf(node, wait); rep != written {
				write(ctx, rep, wait)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
		if written.node != "" {
			write(context.WithoutCancel(ctx), brokerReport{}, 0)
		}
	}
}
