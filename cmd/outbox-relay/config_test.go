package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

type testFlags struct {
	a, b, c, d string
	n          int
	on         bool
	wait       time.Duration
}

func newTestFlagSet() (*flag.FlagSet, *testFlags) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(new(bytes.Buffer))
	var f testFlags
	fs.StringVar(&f.a, "flag-a", "default-a", "")
	fs.StringVar(&f.b, "flag-b", "default-b", "")
	fs.StringVar(&f.c, "flag-c", "default-c", "")
	fs.StringVar(&f.d, "flag-d", "default-d", "")
	fs.IntVar(&f.n, "count", 1, "")
	fs.BoolVar(&f.on, "on", false, "")
	fs.DurationVar(&f.wait, "wait", time.Second, "")
	fs.String("config", "", "")
	return fs, &f
}

func known(fs *flag.FlagSet, extra ...string) map[string]bool {
	k := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { k[f.Name] = true })
	for _, e := range extra {
		k[e] = true
	}
	return k
}

// Flags beat the environment, the environment beats the file, the file
// beats the default.
func TestResolvePrecedence(t *testing.T) {
	file := writeFile(t, "flag-a: file-a\nflag-b: file-b\nflag-c: file-c\ncount: 7\non: true\nwait: 5s\nother-commands-flag: x\n")
	fs, f := newTestFlagSet()
	if err := fs.Parse([]string{"--flag-a=cli-a", "--config", file}); err != nil {
		t.Fatal(err)
	}
	env := envMap(map[string]string{
		"OUTBOX_RELAY_FLAG_A": "env-a",
		"OUTBOX_RELAY_FLAG_B": "env-b",
		"OUTBOX_RELAY_FLAG_C": "", // empty counts as unset
	})
	if err := resolve(fs, env, known(fs, "other-commands-flag")); err != nil {
		t.Fatal(err)
	}
	got := []string{f.a, f.b, f.c, f.d}
	want := []string{"cli-a", "env-b", "file-c", "default-d"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if f.n != 7 || !f.on || f.wait != 5*time.Second {
		t.Fatalf("typed values from the file: %d %v %v", f.n, f.on, f.wait)
	}
}

func TestResolveConfigFromEnv(t *testing.T) {
	file := writeFile(t, "flag-d: file-d\n")
	fs, f := newTestFlagSet()
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := resolve(fs, envMap(map[string]string{"OUTBOX_RELAY_CONFIG": file}), known(fs)); err != nil {
		t.Fatal(err)
	}
	if f.d != "file-d" {
		t.Fatalf("flag-d = %q", f.d)
	}
}

func TestResolveErrors(t *testing.T) {
	cases := []struct {
		name, file string
		env        map[string]string
		want       string
	}{
		{"unknown key", "flag-a: x\nflg-b: y\n", nil, `unknown key "flg-b"`},
		{"config key", "config: other.yaml\n", nil, `key "config" cannot be set`},
		{"duplicate key", "flag-a: x\nflag-a: y\n", nil, `"flag-a" given twice`},
		{"list value", "flag-a: [1, 2]\n", nil, `key "flag-a": want a single value`},
		{"null value", "flag-a:\n", nil, `key "flag-a" has no value`},
		{"not a mapping", "- a\n- b\n", nil, "want a mapping"},
		{"bad file value", "count: many\n", nil, "count"},
		{"bad env value", "", map[string]string{"OUTBOX_RELAY_ON": "perhaps"}, "OUTBOX_RELAY_ON"},
		{"bad yaml", "flag-a: [\n", nil, "config file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs, _ := newTestFlagSet()
			args := []string{}
			if c.file != "" {
				args = append(args, "--config", writeFile(t, c.file))
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			err := resolve(fs, envMap(c.env), known(fs))
			var ue *usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want a usage error containing %q", err, c.want)
			}
		})
	}
	fs, _ := newTestFlagSet()
	_ = fs.Parse([]string{"--config", filepath.Join(t.TempDir(), "missing.yaml")})
	if err := resolve(fs, envMap(nil), known(fs)); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("missing file: %v", err)
	}
}

func TestResolveEmptyFile(t *testing.T) {
	for _, content := range []string{"", "# only a comment\n"} {
		fs, f := newTestFlagSet()
		_ = fs.Parse([]string{"--config", writeFile(t, content)})
		if err := resolve(fs, envMap(nil), known(fs)); err != nil || f.a != "default-a" {
			t.Fatalf("%q: %v, %q", content, err, f.a)
		}
	}
}

// An override flag (declareOverride) counts only on the command line: set in
// the environment or the file it is refused with a usage error naming the
// flag, even when it is typed too; typed alone it is set.
func TestResolveOverrideOnlyFromCommandLine(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		file string
		want string // in the error; "" for none
		set  bool   // the flag's value without an error
	}{
		{"typed", []string{"--force"}, nil, "", "", true},
		{"typed false", []string{"--force=false"}, nil, "", "", false},
		{"not set", nil, nil, "flag-a: x\n", "", false},
		{"empty in the environment", nil, map[string]string{"OUTBOX_RELAY_FORCE": ""}, "", "", false},
		{"environment", nil, map[string]string{"OUTBOX_RELAY_FORCE": "true"}, "", "environment OUTBOX_RELAY_FORCE sets --force", false},
		{"environment false", nil, map[string]string{"OUTBOX_RELAY_FORCE": "false"}, "", "environment OUTBOX_RELAY_FORCE sets --force", false},
		{"environment and typed", []string{"--force"}, map[string]string{"OUTBOX_RELAY_FORCE": "true"}, "", "environment OUTBOX_RELAY_FORCE sets --force", false},
		{"file", nil, nil, "flag-a: x\nforce: true\n", `:2: key "force": --force`, false},
		{"file and typed", []string{"--force"}, nil, "force: yes\n", `key "force": --force`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs, _ := newTestFlagSet()
			force := new(bool)
			declareOverride(fs, force, "force", "override a refusal")
			args := c.args
			if c.file != "" {
				args = append(args, "--config", writeFile(t, c.file))
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			err := resolve(fs, envMap(c.env), known(fs))
			if c.want == "" {
				if err != nil || *force != c.set {
					t.Fatalf("err %v, --force %v; want no error, --force %v", err, *force, c.set)
				}
				return
			}
			var ue *usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "only when typed on the command line") {
				t.Fatalf("err = %v, want a usage error with %q saying it counts only when typed on the command line", err, c.want)
			}
			if len(c.args) == 0 && *force {
				t.Fatal("--force set from the environment or the file although refused")
			}
		})
	}
}

// The flags that override a refusal are declared with declareOverride, so
// resolve refuses them from the environment and the file: these, and no
// other flag named like one.
func TestOverrideFlagsDeclared(t *testing.T) {
	want := map[string]string{"checkpoint": "force", "dedup-cleanup": "force", "failed": "all", "run": "accept-lost-gtids"}
	looksLikeOne := regexp.MustCompile(`^(force|all|yes)$|^(accept|allow|skip|ignore|no-check)-`)
	for name, c := range commands {
		fs, _, _ := newFlagSet(c)
		var got []string
		fs.VisitAll(func(f *flag.Flag) {
			switch {
			case isOverride(f):
				got = append(got, f.Name)
			case looksLikeOne.MatchString(f.Name):
				t.Errorf("%s --%s reads like an override of a safety check but is not declared with declareOverride", name, f.Name)
			}
		})
		if strings.Join(got, ",") != want[name] {
			t.Errorf("%s: override flags %v, want %q", name, got, want[name])
		}
	}
}

func TestEnvName(t *testing.T) {
	if got := envName("mysql-dsn"); got != "OUTBOX_RELAY_MYSQL_DSN" {
		t.Fatal(got)
	}
}

// run with in-process commands: exit codes and the one-line messages.
func TestRunExitCodes(t *testing.T) {
	cases := []struct {
		args         []string
		env          map[string]string
		code         int
		stdout, errs string
	}{
		{nil, nil, exitUsage, "", "no command given"},
		{[]string{"help"}, nil, exitOK, "Commands:", ""},
		{[]string{"--help"}, nil, exitOK, "migrate", ""},
		{[]string{"help", "migrate"}, nil, exitOK, "OUTBOX_RELAY_MYSQL_DSN", ""},
		{[]string{"migrate", "--help"}, nil, exitOK, "--partitioned", ""},
		{[]string{"run", "--help"}, nil, exitOK, "several URLs separated by commas for the nodes of a cluster", ""},
		{[]string{"version", "-h"}, nil, exitOK, "Usage: outbox-relay version", ""},
		{[]string{"frobnicate"}, nil, exitUsage, "", `unknown command "frobnicate"`},
		{[]string{"migrate", "--no-such-flag"}, nil, exitUsage, "", "no-such-flag"},
		{[]string{"migrate", "extra"}, nil, exitUsage, "", "takes no arguments"},
		{[]string{"migrate", "--table", "bad-name"}, nil, exitUsage, "", "--table"},
		{[]string{"migrate", "--log-format", "xml"}, nil, exitUsage, "", "--log-format"},
		{[]string{"migrate"}, map[string]string{"OUTBOX_RELAY_PARTITIONED": "maybe"}, exitUsage, "", "OUTBOX_RELAY_PARTITIONED"},
		{[]string{"migrate", "--mysql-dsn", "root:hunter2pw@tcp(127.0.0.1:3306)/"}, nil, exitUsage, "", "names no database"},
		{[]string{"migrate", "--mysql-dsn", "root:hunter2pw@tcp(127.0.0.1:1)/db"}, nil, exitFailure, "", "connection refused"},
		{[]string{"version"}, nil, exitOK, "outbox-relay dev (go", ""},
	}
	for _, c := range cases {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), c.args, &stdout, &stderr, envMap(c.env))
		if code != c.code || !strings.Contains(stdout.String(), c.stdout) || !strings.Contains(stderr.String(), c.errs) {
			t.Errorf("run %q: code %d, stdout %q, stderr %q; want code %d, stdout ~ %q, stderr ~ %q",
				c.args, code, stdout.String(), stderr.String(), c.code, c.stdout, c.errs)
		}
		if strings.Contains(stdout.String()+stderr.String(), "hunter2pw") {
			t.Errorf("run %q printed the password: %s", c.args, stderr.String())
		}
		if c.code != exitOK && strings.Count(strings.TrimSpace(lastLine(stderr.String())), "\n") != 0 {
			t.Errorf("run %q: error is not one line", c.args)
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// Every registered command's flags have a help text and an env name, and
// the config file's known keys include them.
func TestCommandsWellFormed(t *testing.T) {
	keys := knownKeys()
	for name, c := range commands {
		if c.summary == "" {
			t.Errorf("%s: no summary", name)
		}
		fs, _, runner := newFlagSet(c)
		if runner == nil {
			t.Errorf("%s: setup returned no runner", name)
		}
		fs.VisitAll(func(f *flag.Flag) {
			if f.Usage == "" {
				t.Errorf("%s --%s: no usage text", name, f.Name)
			}
			if !keys[f.Name] {
				t.Errorf("%s --%s missing from config keys", name, f.Name)
			}
		})
	}
}
