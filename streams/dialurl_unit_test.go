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
func TestUnitDialURLCarriesThePasswordFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("s3cr:t@x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{URL: "rabbitmq-stream://relay@10.0.0.1:5552/vh", PasswordFile: file}
	got, err := cfg.dialURL()
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(got)
	if err != nil {
		t.Fatal(err)
	}
	if pw, _ := u.User.Password(); pw != "s3cr:t@x" || u.User.Username() != "relay" || u.Host != "10.0.0.1:5552" || u.Path != "/vh" {
		t.Fatalf("dial URL %s: want user relay with the file's password at 10.0.0.1:5552/vh", u.Redacted())
	}

	// Without a file the URL is dialed as it is.
	cfg.PasswordFile = ""
	if got, err := cfg.dialURL(); err != nil || got != cfg.URL {
		t.Fatalf("without a password file: %q, %v", got, err)
	}

	cfg.PasswordFile = filepath.Join(t.TempDir(), "missing")
	if _, err := cfg.dialURL(); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("unreadable password file: %v, want an error naming it", err)
	}
}
