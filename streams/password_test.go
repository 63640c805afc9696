package streams_test

import (
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/streams"
)

// Finding 4 against the real broker: a stream URL without a password and
// the password in a file (--amqp-password-file) logs in; the client took
// the credentials from the URL alone, so the file's password never reached
// the broker and the login failed.
func TestDialLogsInWithThePasswordFile(t *testing.T) {
	t.Parallel()
	b := testenv.RabbitMQ(t)
	derived, err := streams.FromAMQP(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(derived)
	if err != nil {
		t.Fatal(err)
	}
	pw, ok := u.User.Password()
	if !ok {
		t.Skip("the test broker's URL has no password")
	}
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u.User = url.User(u.User.Username())
	cfg := streams.Config{Stream: "test-password", Partitions: 1, URL: u.String(), Producer: "p", Window: 1, PasswordFile: file}
	pub, err := streams.Dial(cfg)
	if err != nil {
		t.Fatalf("dial with the password file: %v", err)
	}
	_ = pub.Close()
}
