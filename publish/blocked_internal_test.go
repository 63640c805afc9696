package publish

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// The broker's own connection.blocked needs a memory alarm, which would
// block every other test using the shared broker; this drives the gate the
// NotifyBlocked listener sets instead. TestMemoryAlarmBlocksPublish
// (OUTBOX_TEST_MEMORY_ALARM=1) does it for real.
func TestPublishWaitsWhileBlocked(t *testing.T) {
	b := testenv.RabbitMQ(t)
	ctx := context.Background()
	p, err := New(ctx, Config{URL: b.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := make(chan Result, 1)
	c, err := p.NewChannel(func(r Result) { got <- r })
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the connection, then block.
	deadline := time.Now().Add(10 * time.Second)
	for conn, _, _, _ := p.state(); conn == nil; conn, _, _, _ = p.state() {
		if time.Now().After(deadline) {
			t.Fatal("no connection within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.setBlocked(true)
	if !p.Blocked() {
		t.Fatal("Blocked() false after connection.blocked")
	}
	m := Message{Exchange: b.Exchange, RoutingKey: "k"}
	m.Publishing.MessageId = "blocked-1"
	// The deadline, and the bounded wait below, are the assertions: nothing
	// marks "Publish is still waiting". A Publish that does not wait returns
	// at once and fails; a slow machine only makes the check weaker.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := c.Publish(short, m); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish while blocked: %v, want DeadlineExceeded", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Publish(ctx, m) }()
	select {
	case err := <-errc:
		t.Fatalf("Publish returned %v while blocked", err)
	case <-time.After(200 * time.Millisecond):
	}
	p.setBlocked(false)
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Publish still waiting after unblock")
	}
	if r := <-got; r.Outcome != Confirmed {
		t.Fatalf("result %+v, want Confirmed", r)
	}
}

func TestMemoryAlarmBlocksPublish(t *testing.T) {
	if os.Getenv("OUTBOX_TEST_MEMORY_ALARM") != "1" {
		t.Skip("sets a memory alarm on the broker, blocking every publisher on it; OUTBOX_TEST_MEMORY_ALARM=1 to run")
	}
	b := testenv.RabbitMQ(t)
	ctx := context.Background()
	p, err := New(ctx, Config{URL: b.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := make(chan Result, 2)
	c, err := p.NewChannel(func(r Result) { got <- r })
	if err != nil {
		t.Fatal(err)
	}
	m := Message{Exchange: b.Exchange, RoutingKey: "k"}
	if err := c.Publish(ctx, m); err != nil {
		t.Fatal(err)
	}
	<-got
	rabbitmqctl(t, "set_vm_memory_high_watermark", "0.0000001")
	t.Cleanup(func() { rabbitmqctl(t, "set_vm_memory_high_watermark", "0.4") })
	// RabbitMQ sends connection.blocked on the first publish under the alarm.
	if err := c.Publish(ctx, m); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !p.Blocked() {
		if time.Now().After(deadline) {
			t.Fatal("no connection.blocked within 10s of the alarm")
		}
		time.Sleep(10 * time.Millisecond)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := c.Publish(short, m); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish under the alarm: %v, want DeadlineExceeded", err)
	}
	rabbitmqctl(t, "set_vm_memory_high_watermark", "0.4")
	long, cancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel2()
	if err := c.Publish(long, m); err != nil {
		t.Fatalf("Publish after the alarm cleared: %v", err)
	}
	if err := c.Flush(long); err != nil {
		t.Fatal(err)
	}
}
