package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/outbox-relay/outbox-relay/position"
)

// stateFile is Config.StateFile: the newest position this process
// published, kept on local disk so that a process started fresh (after a
// restart, or against a promoted replica) checks a lossy failover against
// what it published rather than only the replicated progress row. The
// position is publishedLog's: the GTIDs of every transaction of which at
// least one message was handed to the broker, confirmed or not, and of every
// acknowledged position, folded into one GTID set (stateJSON, with the relay
// name and the flavor). A process that loads the file starts its
// publishedLog from it and names the file in a refusal.
//
// failoverCheck.save writes it whenever that position moved since the last
// write (its comment says when it runs), by writing a temporary file and
// renaming it over the old one, without fsync: it survives the process being
// killed, and after a crash of the host it may lag by what the page cache
// held.
type stateFile struct {
	path      string
	relayName string
}

// stateJSON is the file's content.
type stateJSON struct {
	RelayName string    `json:"relay_name"`
	Flavor    string    `json:"flavor"`
	GTIDSet   string    `json:"gtid_set"`
	UpdatedAt time.Time `json:"updated_at"`
}

// load returns the position the file holds; the zero Position when the
// file does not exist yet. A file of another relay name, or one that does
// not parse, is an error: resuming without it would silently drop the check
// it exists for.
func (s *stateFile) load() (position.Position, error) {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return position.Position{}, nil
	}
	if err != nil {
		return position.Position{}, fmt.Errorf("read Config.StateFile: %w", err)
	}
	var st stateJSON
	if err := json.Unmarshal(data, &st); err != nil {
		return position.Position{}, fmt.Errorf("read Config.StateFile %s: not a state file this relay wrote (%v); move it away to start without it", s.path, err)
	}
	if st.RelayName != s.relayName {
		return position.Position{}, fmt.Errorf("Config.StateFile %s belongs to relay name %q, not %q: give each relay name its own file", s.path, st.RelayName, s.relayName)
	}
	if _, err := position.ParseGTIDSet(st.Flavor, st.GTIDSet); err != nil {
		return position.Position{}, fmt.Errorf("read Config.StateFile %s: %w; move it away to start without it", s.path, err)
	}
	return position.Position{Flavor: st.Flavor, GTIDSet: st.GTIDSet}, nil
}

// store replaces the file's content with p.
func (s *stateFile) store(p position.Position) error {
	data, err := json.Marshal(stateJSON{RelayName: s.relayName, Flavor: p.Flavor, GTIDSet: p.GTIDSet, UpdatedAt: time.Now().UTC()})
	if err != nil {
		return fmt.Errorf("write Config.StateFile: %w", err)
	}
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write Config.StateFile: %w", err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("write Config.StateFile: %w", err)
	}
	return nil
}

// check makes sure the file can be written where it is: its directory
// exists and is writable. Run at start, so a wrong path is a configuration
// error rather than a check that silently never happens.
func (s *stateFile) check() error {
	dir := filepath.Dir(s.path)
	f, err := os.CreateTemp(dir, ".outbox-relay-state-*")
	if err != nil {
		return fmt.Errorf("Config.StateFile %s: cannot write in %s: %w", s.path, dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}
