package streams

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The password of --amqp-password-file reaches the stream client: the
// client takes the credentials from the URL it is given (a password set
// beside it is overwritten by the URL's), so the URL the publisher dials
// carries the file's password; the error of an unreadable file names the
// file, never a password.
func TestUnitDialURLsCarryThePasswordFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("s3cr:t@x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Each node of a list gets it.
	cfg := Config{URL: "rabbitmq-stream://relay@10.0.0.1:5552/vh, rabbitmq-stream://relay@10.0.0.2:5552/vh", PasswordFile: file}
	got, err := cfg.dialURLs()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d dial URLs, want 2", len(got))
	}
	for i, raw := range got {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		host := []string{"10.0.0.1:5552", "10.0.0.2:5552"}[i]
		if pw, _ := u.User.Password(); pw != "s3cr:t@x" || u.User.Username() != "relay" || u.Host != host || u.Path != "/vh" {
			t.Fatalf("dial URL %s: want user relay with the file's password at %s/vh", u.Redacted(), host)
		}
	}

	// Without a file the URL is dialed as it is.
	cfg = Config{URL: "rabbitmq-stream://relay:pw@10.0.0.1:5552/vh"}
	if got, err := cfg.dialURLs(); err != nil || len(got) != 1 || got[0] != cfg.URL {
		t.Fatalf("without a password file: %q, %v", got, err)
	}

	cfg.PasswordFile = filepath.Join(t.TempDir(), "missing")
	if _, err := cfg.dialURLs(); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("unreadable password file: %v, want an error naming it", err)
	}
}
