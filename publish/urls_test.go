package publish_test

import (
	"strings"
	"testing"

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
