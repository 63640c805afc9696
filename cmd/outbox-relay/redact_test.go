package main

import (
	"bytes"
	"context"
	"flag"
	"slices"
	"strings"
	"testing"
)

func TestPasswordsOfFlags(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("mysql-dsn", "app:db-secret-1@tcp(db:3306)/shop", "")
	fs.String("amqp-url", "amqp://app:mq-secret-2@rabbit-1:5672/,amqp://app:mq%2Fsecret-3@rabbit-2:5672/", "")
	fs.String("table", "not-a-secret", "")
	pw := passwords(fs)
	slices.Sort(pw)
	if strings.Join(pw, ",") != "db-secret-1,mq%2Fsecret-3,mq-secret-2,mq/secret-3" {
		t.Fatalf("passwords = %v", pw)
	}
	if displayValue("mysql-dsn", "u:pw12@tcp(h)/d") != "u:xxxxx@tcp(h)/d" || displayValue("table", "u:pw@x/y") != "u:pw@x/y" {
		t.Fatal("displayValue")
	}
}

// Everything run prints, on stdout and stderr, passes through the scrubber
// of the command's passwords: here a runtime error quoting the DSN, and a
// usage error quoting a stray argument.
func TestRunScrubsOutput(t *testing.T) {
	env := envMap(map[string]string{"OUTBOX_RELAY_MYSQL_DSN": "app:Zr8/qk@tcp(127.0.0.1:1)/shop?timeout=1s"})
	for _, args := range [][]string{{"status"}, {"status", "app:Zr8/qk@tcp(127.0.0.1:1)/shop"}} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), args, &stdout, &stderr, env)
		if code == 0 || strings.Contains(stdout.String()+stderr.String(), "Zr8") {
			t.Errorf("%v: exit %d\nstdout: %s\nstderr: %s", args, code, stdout.String(), stderr.String())
		}
	}
}
