package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// failed and checkpoint run their sub-commands with flag sets of their own:
// a flag of another sub-command is refused wherever it is typed, one set by
// the environment for another sub-command is ignored, and the usage errors
// come before any connection (the DSN points at a closed port).
func TestSubcommandFlags(t *testing.T) {
	dsn := []string{"--mysql-dsn", "root@tcp(127.0.0.1:1)/x"}
	for _, c := range []struct {
		args []string
		env  map[string]string
		code int
		err  string
	}{
		{[]string{"failed"}, nil, exitUsage, "failed: give a subcommand: list, show ID"},
		{[]string{"failed", "frob"}, nil, exitUsage, `unknown subcommand "frob": want list, show, retry or purge`},
		{[]string{"failed", "list", "--dry-run"}, nil, exitUsage, "failed list does not take --dry-run"},
		{[]string{"failed", "--dry-run", "list"}, nil, exitUsage, "failed list does not take --dry-run"},
		{[]string{"failed", "retry", "1", "--limit", "3"}, nil, exitUsage, "failed retry does not take --limit"},
		{[]string{"failed", "purge", "1", "--batch-size", "10"}, nil, exitUsage, "failed purge does not take --batch-size"},
		{[]string{"failed", "list", "--nosuch"}, nil, exitUsage, "failed: flag provided but not defined: -nosuch; run 'outbox-relay failed --help'"},
		{[]string{"failed", "list", "extra"}, nil, exitUsage, `failed list takes no arguments, got "extra"`},
		{[]string{"failed", "show"}, nil, exitUsage, "failed show takes 1 ID"},
		{[]string{"failed", "retry", "--all", "1"}, nil, exitUsage, "give IDs (message ids or row ids) or --all (not both)"},
		{[]string{"failed", "retry"}, map[string]string{"OUTBOX_RELAY_ALL": "true"}, exitUsage, "counts only when typed on the command line"},
		{[]string{"failed", "list"}, map[string]string{"OUTBOX_RELAY_LIMIT": "0"}, exitUsage, "--limit 0: want at least 1"},
		{[]string{"failed", "retry", "1"}, map[string]string{"OUTBOX_RELAY_LIMIT": "0"}, exitFailure, "connect to MySQL"},
		{[]string{"failed", "list", "--json"}, nil, exitFailure, "connect to MySQL"},
		{[]string{"checkpoint"}, nil, exitUsage, "checkpoint: give one subcommand: show or set"},
		{[]string{"checkpoint", "show", "extra"}, nil, exitUsage, "give one subcommand: show or set"},
		{[]string{"checkpoint", "show", "--force"}, nil, exitUsage, "checkpoint show does not take --force"},
		{[]string{"checkpoint", "--gtid", "0-1-1", "show"}, nil, exitUsage, "checkpoint show does not take --gtid"},
		{[]string{"checkpoint", "set", "--file", "f"}, nil, exitUsage, "--file needs --pos"},
		{[]string{"checkpoint", "--pos", "4", "set", "--file", "f", "--relay-name="}, nil, exitUsage, "--relay-name is empty"},
		{[]string{"checkpoint", "set", "--pos", "3", "--gtid", "0-1-1"}, nil, exitUsage, "--pos goes with --file"},
		{[]string{"checkpoint", "set", "--gtid", "0-1-1"}, map[string]string{"OUTBOX_RELAY_FORCE": "true"}, exitUsage, "counts only when typed on the command line"},
	} {
		var stdout, stderr bytes.Buffer
		args := append(append([]string{}, c.args...), dsn...)
		code := run(context.Background(), args, &stdout, &stderr, envMap(c.env))
		if code != c.code || !strings.Contains(stderr.String(), c.err) {
			t.Errorf("%q (env %v): exit %d, stderr %q; want exit %d with %q", c.args, c.env, code, stderr.String(), c.code, c.err)
		}
	}
}
