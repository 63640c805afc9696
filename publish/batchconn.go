package publish

import (
	"net"
	"sync"
)

// maxQueuedBytes bounds what a batchConn holds that is not yet written:
// Write waits while this much is queued.
const maxQueuedBytes = 256 << 10

// batchConn is the connection under amqp091. amqp091 flushes its buffer
// after every message, so each publish is one write system call and one
// TCP segment, and the broker reads and parses each on its own. Here Write
// only queues the bytes and one goroutine writes whatever has queued: while
// it is in a system call, the lanes' next messages gather, and they go out
// together in the next one. A lone message is written at once, so latency
// does not suffer; under load the frames of many messages share a call.
// On this project's 2-core test machines system calls and TCP segments are
// what the relay and the broker spend their time on (docs/benchmarks.md).
//
// A Write that returned nil may not reach the broker if the connection
// breaks before the writer sends it; the next Write returns that error.
// That is no weaker than a socket write, whose bytes can be lost the same
// way: publisher confirms, not writes, tell what the broker has.
type batchConn struct {
	net.Conn

	mu      sync.Mutex
	space   *sync.Cond // signalled when queued bytes were taken or err set
	queued  []byte
	err     error         // sticky: the first write error, or net.ErrClosed
	pending chan struct{} // capacity 1: queued became non-empty
	done    chan struct{} // closed when the writer returns
}

func newBatchConn(conn net.Conn) *batchConn {
	c := &batchConn{Conn: conn, pending: make(chan struct{}, 1), done: make(chan struct{})}
	c.space = sync.NewCond(&c.mu)
	go c.writer()
	return c
}

// Write queues p for the writer goroutine. It waits while maxQueuedBytes
// are queued, and returns the connection's first write error once there
// was one.
func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.err == nil && len(c.queued) > 0 && len(c.queued)+len(p) > maxQueuedBytes {
		c.space.Wait()
	}
	if c.err != nil {
		return 0, c.err
	}
	wake := len(c.queued) == 0
	c.queued = append(c.queued, p...)
	if wake {
		select {
		case c.pending <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// writer writes what is queued, in order, until a write fails or Close.
func (c *batchConn) writer() {
	defer close(c.done)
	var out []byte
	for range c.pending {
		for {
			c.mu.Lock()
			if c.err != nil {
				c.mu.Unlock()
				return
			}
			if len(c.queued) == 0 {
				c.mu.Unlock()
				break
			}
			// Swap buffers: the lanes fill one while this writes the other.
			out, c.queued = c.queued, out[:0]
			c.space.Broadcast()
			c.mu.Unlock()
			if _, err := c.Conn.Write(out); err != nil {
				c.fail(err)
				return
			}
		}
	}
}

func (c *batchConn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
	c.space.Broadcast()
}

// Close closes the connection (which ends a write in progress) and waits
// for the writer goroutine. Bytes still queued are dropped.
func (c *batchConn) Close() error {
	err := c.Conn.Close()
	c.fail(net.ErrClosed)
	select {
	case c.pending <- struct{}{}: // wake an idle writer so it sees err
	default:
	}
	<-c.done
	return err
}
