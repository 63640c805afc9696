package relay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/position"
)

// The state file round-trips a position; a missing file is no position;
// another relay name's file, a damaged file and an unwritable directory are
// errors that say what to do.
func TestStateFile(t *testing.T) {
	dir := t.TempDir()
	s := &stateFile{path: filepath.Join(dir, "state.json"), relayName: "orders"}
	if err := s.check(); err != nil {
		t.Fatal(err)
	}
	if p, err := s.load(); err != nil || !p.IsZero() {
		t.Fatalf("missing file: %v, %v", p, err)
	}
	want := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-100,1-2-7"}
	if err := s.store(want); err != nil {
		t.Fatal(err)
	}
	if p, err := s.load(); err != nil || p != want {
		t.Fatalf("load after store: %v, %v; want %v", p, err, want)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("left behind: %v", entries)
	}

	other := &stateFile{path: s.path, relayName: "billing"}
	if _, err := other.load(); err == nil || !strings.Contains(err.Error(), `belongs to relay name "orders"`) {
		t.Fatalf("another relay's file: %v", err)
	}
	if err := os.WriteFile(s.path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.load(); err == nil || !strings.Contains(err.Error(), "move it away") {
		t.Fatalf("damaged file: %v", err)
	}
	gone := &stateFile{path: filepath.Join(dir, "no-such-dir", "state.json"), relayName: "orders"}
	if err := gone.check(); err == nil || !strings.Contains(err.Error(), "cannot write") {
		t.Fatalf("missing directory: %v", err)
	}
}
