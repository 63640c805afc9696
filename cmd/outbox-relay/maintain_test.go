package main

import (
	"flag"
	"io"
	"slices"
	"testing"
	"time"
)

func TestParseAge(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"7d": 7 * 24 * time.Hour, "30D": 30 * 24 * time.Hour, "1d12h": 36 * time.Hour, "36h": 36 * time.Hour,
		"90m": 90 * time.Minute, "0": 0, "0d": 0, " 2d ": 48 * time.Hour,
	} {
		if got, err := parseAge(in); err != nil || got != want {
			t.Errorf("parseAge(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "7 days", "-1d", "-5m", "1.5d", "7d-1h", "100001d", "1w"} {
		if got, err := parseAge(in); err == nil {
			t.Errorf("parseAge(%q) = %v, want an error", in, got)
		}
	}
	for d, want := range map[time.Duration]string{7 * 24 * time.Hour: "7d", 36 * time.Hour: "36h0m0s", 0: "0s"} {
		if got := formatAge(d); got != want {
			t.Errorf("formatAge(%v) = %q, want %q", d, got, want)
		}
	}
}

// Flags may follow the subcommand and the ids; "--" ends the flags.
func TestParseInterleaved(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dry := fs.Bool("dry-run", false, "")
	asJSON := fs.Bool("json", false, "")
	limit := fs.Int("limit", 0, "")
	args, given, err := parseInterleaved(fs, []string{"retry", "a", "--dry-run", "b", "--limit=3", "--", "--json"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(args, []string{"retry", "a", "b", "--json"}) || !*dry || *asJSON || *limit != 3 ||
		!given["dry-run"] || !given["limit"] || given["json"] {
		t.Fatalf("args %q, dry %v, json %v, limit %d, given %v", args, *dry, *asJSON, *limit, given)
	}
	if _, _, err := parseInterleaved(fs, []string{"list", "--bogus"}); err == nil {
		t.Fatal("an unknown flag after the subcommand was accepted")
	}
}
