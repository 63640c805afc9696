package main

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The library's errors name Config fields; the CLI prints the flag.
func TestFlagNames(t *testing.T) {
	for in, want := range map[string]string{
		"Config.LeaderLease 10s: at least 3 heartbeat intervals (12s)": "--leader-lease 10s: at least 3 heartbeat intervals (12s)",
		"Config.MySQLTLSCert and Config.MySQLTLSKey go together":       "--mysql-tls-cert and --mysql-tls-key go together",
		"ConnOptions.TLSCA x.pem holds no PEM certificate":             "--amqp-tls-ca x.pem holds no PEM certificate",
		"Config.Logger is not a flag":                                  "Config.Logger is not a flag",
		"Table 'db.outbox' doesn't exist":                              "Table 'db.outbox' doesn't exist",
	} {
		if got := flagNames(in); got != want {
			t.Errorf("flagNames(%q) = %q, want %q", in, got, want)
		}
	}
}

// Every Config field a library string names is in flagOfField, and every
// flag there is declared by a command.
func TestFieldTableComplete(t *testing.T) {
	flags := map[string]bool{}
	for _, c := range commands {
		fs, _, _ := newFlagSet(c)
		fs.VisitAll(func(f *flag.Flag) { flags["--"+f.Name] = true })
	}
	quoted := regexp.MustCompile(`"(?:[^"\\\n]|\\.)*"`)
	root := filepath.Join("..", "..")
	named := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (d.Name() == "cmd" || d.Name() == "examples" || d.Name() == "testenv" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, lit := range quoted.FindAllString(string(src), -1) {
			for _, field := range fieldName.FindAllString(lit, -1) {
				named[field] = path
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(named) == 0 {
		t.Fatal("no library string names a Config field: the scan is broken")
	}
	for field, path := range named {
		f := flagOfField(field)
		if f == "" && field != "Config.Logger" {
			t.Errorf("%s names %s, which flagOfField does not map to a flag", path, field)
		}
		if f != "" && !flags[f] {
			t.Errorf("flagOfField(%s) = %s, which no command declares", field, f)
		}
	}
}
