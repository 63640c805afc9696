package main

import (
	"errors"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/replay"
)

// FuzzConfigFile feeds --config files to loadConfigFile and the values it
// returns to resolve. Properties: no panic; a file refused is a usage error
// (exit 2) naming the file; a file accepted yields only known keys, each
// once, none of them "config", with the scalar text as written — no more
// text than the file holds (YAML escapes may grow a character to 3 bytes),
// and written back as YAML it reads back the same. Seed corpus:
// testdata/fuzz/FuzzConfigFile/.
func FuzzConfigFile(f *testing.F) {
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "relay.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		fs, _ := newTestFlagSet()
		keys := known(fs, "mysql-dsn")
		kvs, err := loadConfigFile(path, keys)
		if err != nil {
			var ue *usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), path) {
				t.Fatalf("refusal %q (%T) is not a usage error naming the file", err, err)
			}
			return
		}
		seen := map[string]bool{}
		size := 0
		for _, kv := range kvs {
			if !keys[kv.key] || kv.key == "config" || seen[kv.key] {
				t.Fatalf("key %q accepted (known %v, seen before %v)", kv.key, keys[kv.key], seen[kv.key])
			}
			seen[kv.key] = true
			size += len(kv.key) + len(kv.value)
		}
		if size > 3*len(data) {
			t.Fatalf("%d bytes of keys and values from a %d-byte file", size, len(data))
		}
		// Written back as a mapping of double-quoted strings, the file
		// reads back the same. (Not in yaml.v3's choice of style: it writes
		// a value starting with a newline as a literal block that loses the
		// newline, seed 86e88bdfcbf085ed.)
		doc := &yaml.Node{Kind: yaml.MappingNode}
		for _, kv := range kvs {
			doc.Content = append(doc.Content,
				&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Style: yaml.DoubleQuotedStyle, Value: kv.key},
				&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Style: yaml.DoubleQuotedStyle, Value: kv.value})
		}
		out, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatalf("marshal %v: %v", kvs, err)
		}
		if len(kvs) > 0 {
			if err := os.WriteFile(path, out, 0o600); err != nil {
				t.Fatal(err)
			}
			again, err := loadConfigFile(path, keys)
			// The same keys and values; lines differ (the file is rewritten).
			same := func(a, b keyValue) bool { return a.key == b.key && a.value == b.value }
			if err != nil || !slices.EqualFunc(again, kvs, same) {
				t.Fatalf("%v read back from %q as %v, %v", kvs, out, again, err)
			}
		}
		// resolve sets the flags from the file or says which value is bad.
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		fs, _ = newTestFlagSet()
		if err := fs.Parse([]string{"--config", path}); err != nil {
			t.Fatal(err)
		}
		if err := resolve(fs, envMap(nil), keys); err != nil {
			var ue *usageError
			if !errors.As(err, &ue) {
				t.Fatalf("resolve: %v (%T) is not a usage error", err, err)
			}
		}
	})
}

// FuzzReplayFilters feeds replay's range and filter flags, as an operator
// types them, through replay's flag set and replay.Config.Validate.
// Properties: no panic; a value refused is named with its flag; a request
// refused by Validate is a *replay.RefusedError (exit 2); a request accepted
// has exactly one start, an end not before its start (at the binlog's
// one-second grain), the times the flags say, the filters as typed, and a
// rate that is a finite number of messages per second whose wait between
// two messages fits a time.Duration. Seed corpus:
// testdata/fuzz/FuzzReplayFilters/.
func FuzzReplayFilters(f *testing.F) {
	f.Fuzz(func(t *testing.T, fromTime, toTime, fromGTID, toGTID, key1, key2, prefix, msgType, exchange, rate string) {
		args := []string{"--dry-run", "--mysql-dsn", "u:p@tcp(127.0.0.1:3306)/app"}
		given := map[string]string{}
		for _, fv := range [...][2]string{
			{"from-time", fromTime}, {"to-time", toTime}, {"from-gtid", fromGTID}, {"to-gtid", toGTID},
			{"partition-key", key1}, {"partition-key", key2}, {"routing-key-prefix", prefix},
			{"message-type", msgType}, {"exchange", exchange}, {"rate", rate},
		} {
			if fv[1] != "" {
				args = append(args, "--"+fv[0]+"="+fv[1])
				given[fv[0]] = fv[1]
			}
		}
		fs := flag.NewFlagSet("replay", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		config, _ := declareReplay(fs)
		if err := fs.Parse(args); err != nil {
			named := false
			for name := range given {
				named = named || strings.Contains(err.Error(), "-"+name)
			}
			if !named {
				t.Fatalf("args %q: refusal %q names no flag", args, err)
			}
			return
		}
		cfg, err := config()
		if err != nil {
			t.Fatalf("args %q: %v", args, err)
		}
		if err := cfg.Validate(); err != nil {
			var re *replay.RefusedError
			if !errors.As(err, &re) {
				t.Fatalf("args %q: refusal %v (%T) is not a *replay.RefusedError", args, err, err)
			}
			return
		}
		r := cfg.Range
		if (r.FromGTID != "") == !r.FromTime.IsZero() {
			t.Fatalf("args %q: accepted with start %q / %v", args, r.FromGTID, r.FromTime)
		}
		if r.ToGTID != "" && !r.ToTime.IsZero() {
			t.Fatalf("args %q: accepted with two ends", args)
		}
		for _, pair := range [][2]string{{"from-time", "from-gtid"}, {"to-time", "to-gtid"}} {
			_, t1 := given[pair[0]]
			_, t2 := given[pair[1]]
			if t1 && t2 {
				t.Fatalf("args %q: accepted with both --%s and --%s", args, pair[0], pair[1])
			}
		}
		for name, got := range map[string]time.Time{"from-time": r.FromTime, "to-time": r.ToTime} {
			if text, ok := given[name]; ok {
				want, err := time.Parse(time.RFC3339, text)
				if epoch := time.Unix(0, 0); err == nil && want.Before(epoch) {
					want = epoch // binlog event times start there
				}
				if err != nil || !got.Equal(want) {
					t.Fatalf("args %q: --%s %q became %v (%v)", args, name, text, got, err)
				}
			}
		}
		if !r.FromTime.IsZero() && !r.ToTime.IsZero() && r.ToTime.Truncate(time.Second).Before(r.FromTime.Truncate(time.Second)) {
			t.Fatalf("args %q: accepted --to-time before --from-time", args)
		}
		var keys []string
		for _, k := range []string{key1, key2} {
			if k != "" {
				keys = append(keys, k)
			}
		}
		fl := cfg.Filter
		if !slices.Equal(fl.PartitionKeys, keys) || fl.RoutingKeyPrefix != prefix || fl.MessageType != msgType ||
			cfg.Exchange != exchange || r.FromGTID != fromGTID || r.ToGTID != toGTID {
			t.Fatalf("args %q: filters became %+v, exchange %q, range %+v", args, fl, cfg.Exchange, r)
		}
		if math.IsNaN(cfg.Rate) || math.IsInf(cfg.Rate, 0) || cfg.Rate < 0 {
			t.Fatalf("args %q: rate %v accepted", args, cfg.Rate)
		}
		if cfg.Rate > 0 {
			if wait := float64(time.Second) / cfg.Rate; wait >= math.MaxInt64 {
				t.Fatalf("args %q: rate %v accepted: one message every %v ns does not fit a time.Duration", args, cfg.Rate, wait)
			}
		}
	})
}
