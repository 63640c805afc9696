package publish_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/publish"
)

// SplitURLs takes one URL or a cluster's several, refuses an empty element
// or a URL without a usable scheme with the fix, and never shows a password.
func TestSplitURLs(t *testing.T) {
	got, err := publish.SplitURLs("amqp://u:pw@a:5672/v, amqps://u:pw@b:5671/v ,amqp://u:pw@c/v")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"amqp://u:pw@a:5672/v", "amqps://u:pw@b:5671/v", "amqp://u:pw@c/v"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("got %q, want %q", got, want)
	}
	for _, c := range []struct{ in, want string }{
		{"", "Config.URL is empty"},
		{"amqp://u:sekret@a:5672/,,amqp://u:sekret@b:5672/", "URL 2 of 3 is empty"},
		{",amqp://u:sekret@a:5672/", "URL 1 of 2 is empty"},
		{"amqp://u:sekret@a:5672/,b:5672", "each URL with its scheme"},
		{"amqp://u:sekret@a:5672/,http://u:sekret@b:15672/", "amqp://user:pass@host:5672/vhost"},
	} {
		_, err := publish.SplitURLs(c.in)
		if err == nil {
			t.Errorf("%q: accepted", c.in)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "sekret") {
			t.Errorf("%q: %v; want %q and no password", c.in, err, c.want)
		}
	}
}

// Dial takes one URL: a list is refused before anything is dialled (the
// broker would get the rest of the list as the vhost and quote it back,
// passwords included), as a refusal naming DialAny, without a password.
func TestDialRefusesAList(t *testing.T) {
	list := "amqp://u:sekret1@127.0.0.1:1/,amqp://u:sekret2@127.0.0.1:1/"
	conn, err := publish.Dial(context.Background(), list, publish.ConnOptions{}, "test")
	if conn != nil {
		conn.Close()
	}
	if err == nil || !publish.IsRefused(err) || !strings.Contains(err.Error(), "DialAny") || strings.Contains(err.Error(), "sekret") {
		t.Fatalf("Dial of a list: %v; want a refusal naming DialAny and no password", err)
	}
}

// DialAny dials a cluster's nodes in order and connects to the first that
// answers; when none does, a refusal wins over an unreachable node, and no
// error shows a password.
func TestDialAny(t *testing.T) {
	b := testenv.RabbitMQ(t)
	ctx := context.Background()
	dead := "amqp://u:sekret1@127.0.0.1:1/"
	conn, node, err := publish.DialAny(ctx, dead+", "+b.URL, publish.ConnOptions{}, "test")
	if err != nil {
		t.Fatalf("DialAny with a dead first node: %v", err)
	}
	conn.Close()
	if u, _ := url.Parse(b.URL); node != u.Host {
		t.Fatalf("connected to %q, want %q", node, u.Host)
	}
	wrongUser, _ := url.Parse(b.URL)
	wrongUser.User = url.UserPassword("nobody", "sekret2")
	_, _, err = publish.DialAny(ctx, dead+","+wrongUser.String(), publish.ConnOptions{}, "test")
	if !publish.IsRefused(err) || strings.Contains(err.Error(), "sekret") {
		t.Fatalf("DialAny with a dead node and a refused login: %v; want the refusal, no password", err)
	}
	_, _, err = publish.DialAny(ctx, dead+","+dead, publish.ConnOptions{}, "test")
	if err == nil || publish.IsRefused(err) || strings.Contains(err.Error(), "sekret") {
		t.Fatalf("DialAny with no node answering: %v; want an unreachable broker, no password", err)
	}
}
