package main

import (
	"flag"
	"strings"
	"testing"
)

func TestRedactDSN(t *testing.T) {
	cases := map[string]string{
		"user:pass@tcp(127.0.0.1:3306)/db":              "user:xxxxx@tcp(127.0.0.1:3306)/db",
		"user:p@ss:w/rd@tcp(db:3306)/db?parseTime=true": "user:xxxxx@tcp(db:3306)/db?parseTime=true",
		"root@tcp(127.0.0.1:3306)/outbox":               "root@tcp(127.0.0.1:3306)/outbox",
		"root:@tcp(127.0.0.1:3306)/outbox":              "root:@tcp(127.0.0.1:3306)/outbox",
		"user:secret@unix(/var/run/mysqld.sock)/db":     "user:xxxxx@unix(/var/run/mysqld.sock)/db",
		"user:secret@/db":                               "user:xxxxx@/db",
		"/db":                                           "/db",
		"":                                              "",
		"no slash at all":                               "no slash at all",
	}
	for in, want := range cases {
		if got := redactDSN(in); got != want {
			t.Errorf("redactDSN(%q) = %q, want %q", in, got, want)
		}
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	cases := map[string]string{
		"amqp://guest:guest@127.0.0.1:5672/": "amqp://guest:xxxxx@127.0.0.1:5672/",
		"amqps://u:p%40ss@rabbit:5671/vhost": "amqps://u:xxxxx@rabbit:5671/vhost",
		"amqp://guest@127.0.0.1:5672/":       "amqp://guest@127.0.0.1:5672/",
		"amqp://127.0.0.1:5672/":             "amqp://127.0.0.1:5672/",
		"amqp://u:pa/ss#word@host:5672/v":    "amqp://u:xxxxx@host:5672/v", // does not parse as a URL
		"amqp://user:sec ret%zz@host/":       "amqp://user:xxxxx@host/",
		"http://metrics:9090/":               "http://metrics:9090/",
	}
	for in, want := range cases {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPasswordsAndScrub(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("mysql-dsn", "app:db-secret-1@tcp(db:3306)/shop", "")
	fs.String("amqp-url", "amqp://app:mq-secret-2@rabbit:5672/", "")
	fs.String("table", "not-a-secret", "")
	pw := passwords(fs)
	if strings.Join(pw, ",") != "db-secret-1,mq-secret-2" && strings.Join(pw, ",") != "mq-secret-2,db-secret-1" {
		t.Fatalf("passwords = %v", pw)
	}
	msg := scrub("dial app:db-secret-1@db failed; amqp says mq-secret-2", pw)
	if strings.Contains(msg, "secret") {
		t.Fatalf("scrub left a password: %s", msg)
	}
	if scrub("abc", []string{"a"}) != "abc" {
		t.Fatal("scrub masked a 1-byte password")
	}
	if displayValue("mysql-dsn", "u:pw12@tcp(h)/d") != "u:xxxxx@tcp(h)/d" || displayValue("table", "u:pw@x/y") != "u:pw@x/y" {
		t.Fatal("displayValue")
	}
}
