package main

import (
	"strings"
	"testing"
)

// A mistyped OUTBOX_RELAY_ variable is reported with the closest one that
// is read; a variable another command reads, or one far from any, is
// handled as the contract says (silent; reported without a guess), and the
// value is never printed.
func TestUnknownEnvWarnings(t *testing.T) {
	got := unknownEnvWarnings([]string{
		"OUTBOX_RELAY_MYSQL_DNS=root:secret@tcp(h:3306)/app",
		"OUTBOX_RELAY_MYSQL_DSN=root@tcp(h:3306)/app",
		"OUTBOX_RELAY_RELAY_NAME=x",
		"OUTBOX_RELAY_ZZZZZZZZZZZZZZZZZZZZ=1",
		"PATH=/bin",
	}, knownKeys())
	if len(got) != 2 {
		t.Fatalf("want 2 warnings, got %q", got)
	}
	if !strings.Contains(got[0], "OUTBOX_RELAY_MYSQL_DNS is ignored") || !strings.Contains(got[0], "did you mean OUTBOX_RELAY_MYSQL_DSN?") {
		t.Errorf("typo: %q", got[0])
	}
	if !strings.Contains(got[1], "OUTBOX_RELAY_ZZZZZZZZZZZZZZZZZZZZ is ignored") || strings.Contains(got[1], "did you mean") {
		t.Errorf("far from any: %q", got[1])
	}
	if strings.Contains(strings.Join(got, "\n"), "secret") {
		t.Errorf("a value was printed: %q", got)
	}
}

// The binary warns on stderr and still runs the command.
func TestCLIWarnsAboutMistypedEnv(t *testing.T) {
	bin := relayBinary(t)
	r := runBinary(t, bin, []string{"OUTBOX_RELAY_MYSQL_DNS=root:secret@tcp(127.0.0.1:1)/x"}, "version")
	if r.code != 0 || !strings.Contains(r.stderr, "OUTBOX_RELAY_MYSQL_DNS is ignored") || !strings.Contains(r.stderr, "OUTBOX_RELAY_MYSQL_DSN") || strings.Contains(r.stderr, "secret") {
		t.Fatalf("%+v", r)
	}
}

// Operator commands on a terminal log in console form at warn unless the
// format or level was given; run and bench, and every command whose stderr
// is not a terminal, keep the flags' values (JSON at info by default).
func TestLogDefaults(t *testing.T) {
	none := map[string]bool{}
	for _, c := range []struct {
		command      string
		terminal     bool
		given        map[string]bool
		format, lvl  string
		wantF, wantL string
	}{
		{"pause", true, none, "json", "info", "console", "warn"},
		{"migrate", true, none, "json", "info", "console", "warn"},
		{"replay", true, map[string]bool{"log-format": true}, "json", "info", "json", "warn"},
		{"status", true, map[string]bool{"log-level": true}, "json", "debug", "console", "debug"},
		{"pause", false, none, "json", "info", "json", "info"},
		{"run", true, none, "json", "info", "json", "info"},
		{"bench", true, none, "json", "info", "json", "info"},
	} {
		f, l := logDefaults(c.command, c.terminal, c.given, c.format, c.lvl)
		if f != c.wantF || l != c.wantL {
			t.Errorf("%s terminal=%v given=%v: %s %s, want %s %s", c.command, c.terminal, c.given, f, l, c.wantF, c.wantL)
		}
	}
}

// status wraps the long mode reason of poll mode: no line over the width,
// no word lost.
func TestWrapText(t *testing.T) {
	reason := strings.Repeat("the binlog cannot be read because replication client is missing ", 9) + strings.Repeat("x", 90)
	lines := wrapText(reason, statusWidth)
	if len(lines) < 8 {
		t.Fatalf("%d lines", len(lines))
	}
	for _, l := range lines {
		if len(l) > statusWidth && strings.Contains(l, " ") {
			t.Errorf("line of %d bytes: %q", len(l), l)
		}
	}
	if strings.Join(lines, " ") != strings.TrimSpace(reason) {
		t.Errorf("wrapped text differs:\n%q", strings.Join(lines, " "))
	}
}
