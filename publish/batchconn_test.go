package publish

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// loopbackPair returns both ends of a TCP connection on 127.0.0.1.
func loopbackPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// Every Write arrives whole, in the order the Writes were made, with many
// goroutines writing at once (as the lanes do, serialised by amqp091's
// lock, modelled here by mu).
func TestBatchConnKeepsWritesWholeAndInOrder(t *testing.T) {
	client, server := loopbackPair(t)
	c := newBatchConn(client)
	defer c.Close()

	const writers, perWriter = 8, 2000
	var (
		mu    sync.Mutex
		order [][]byte // what was written, in Write order
		wg    sync.WaitGroup
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				// A frame: length, writer, sequence, then filler of
				// varying size (up to a few KiB, like a message).
				body := bytes.Repeat([]byte{byte(w)}, (i*37)%3000)
				msg := binary.BigEndian.AppendUint32(nil, uint32(8+len(body)))
				msg = binary.BigEndian.AppendUint32(msg, uint32(w))
				msg = binary.BigEndian.AppendUint32(msg, uint32(i))
				msg = append(msg, body...)
				mu.Lock()
				if _, err := c.Write(msg); err != nil {
					mu.Unlock()
					t.Errorf("write: %v", err)
					return
				}
				order = append(order, msg)
				mu.Unlock()
			}
		}()
	}
	total := 0
	for range writers {
		for i := range perWriter {
			total += 12 + (i*37)%3000
		}
	}
	received := make(chan []byte, 1)
	go func() { // reads while the writers write: the queue is bounded
		var got bytes.Buffer
		_, _ = io.CopyN(&got, server, int64(total))
		received <- got.Bytes()
	}()
	var got []byte
	select {
	case got = <-received:
	case <-time.After(30 * time.Second):
		t.Fatal("not everything written arrived within 30s")
	}
	wg.Wait()
	if want := bytes.Join(order, nil); !bytes.Equal(got, want) {
		t.Fatalf("received %d bytes that differ from the %d written, in Write order", len(got), len(want))
	}
}

// Once the peer is gone, a later Write returns the error instead of
// queueing bytes nobody will send; Close ends the writer goroutine.
func TestBatchConnReportsWriteErrorsAndCloses(t *testing.T) {
	client, server := loopbackPair(t)
	c := newBatchConn(client)
	server.(*net.TCPConn).SetLinger(0) // the close resets: the next writes fail
	server.Close()

	msg := make([]byte, 64<<10)
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for err == nil && time.Now().Before(deadline) {
		_, err = c.Write(msg)
	}
	if err == nil {
		t.Fatal("writes to a reset connection kept succeeding for 10s")
	}
	if cerr := c.Close(); cerr != nil {
		t.Errorf("close: %v", cerr)
	}
	select {
	case <-c.done:
	default:
		t.Fatal("the writer goroutine is still running after Close")
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("write after Close succeeded")
	}
}

// Close of an idle connection stops the writer, and writes after it fail.
func TestBatchConnCloseIdle(t *testing.T) {
	client, _ := loopbackPair(t)
	c := newBatchConn(client)
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	<-c.done
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("write after Close succeeded")
	}
}
