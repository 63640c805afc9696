package redact

import (
	"bytes"
	"net/url"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"
)

func TestDSN(t *testing.T) {
	cases := map[string]string{
		"user:pass@tcp(127.0.0.1:3306)/db":               "user:xxxxx@tcp(127.0.0.1:3306)/db",
		"user:p@ss:w/rd(x)9Q@tcp(db:3306)/db?timeout=5s": "user:xxxxx@tcp(db:3306)/db?timeout=5s",
		"user:p%40ss%3Aw@tcp(db:3306)/db":                "user:xxxxx@tcp(db:3306)/db",
		"user:a(b)c@d@tcp(db:3306)/db":                   "user:xxxxx@tcp(db:3306)/db",
		"root@tcp(127.0.0.1:3306)/outbox":                "root@tcp(127.0.0.1:3306)/outbox",
		"root:@tcp(127.0.0.1:3306)/outbox":               "root:@tcp(127.0.0.1:3306)/outbox",
		"user:secret@unix(/var/run/mysqld.sock)/db":      "user:xxxxx@unix(/var/run/mysqld.sock)/db",
		"user:secret@/db":                                "user:xxxxx@/db",
		"tcp(127.0.0.1:3306)/db":                         "tcp(127.0.0.1:3306)/db",
		"/db":                                            "/db",
		"":                                               "",
		"no slash at all":                                "no slash at all",
		// Malformed: the driver's split would cut the password; it is
		// masked whole, from the first ':' to the last '@'.
		"leak:p@ss:w/rd(x)9Q@tcp(127.0.0.1:1)":  "leak:xxxxx@tcp(127.0.0.1:1)",
		"leak:p@ss:w/rd(x)9Q@tcp(127.0.0.1:1/d": "leak:xxxxx@tcp(127.0.0.1:1/d",
		"user:a/b@tcp(h)":                       "user:xxxxx@tcp(h)",
		"user:pw@tcp(h)/db?loc=a/b@c":           "user:xxxxx@c",
		"user:secret":                           "user:xxxxx",
		"127.0.0.1:3306":                        "127.0.0.1:3306",
		"tcp(127.0.0.1:3306)":                   "tcp(127.0.0.1:3306)",
	}
	for in, want := range cases {
		if got := DSN(in); got != want {
			t.Errorf("DSN(%q) = %q, want %q", in, got, want)
		}
		if got := Value(in); got != want {
			t.Errorf("Value(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestURL(t *testing.T) {
	cases := map[string]string{
		"amqp://guest:guest@127.0.0.1:5672/":      "amqp://guest:xxxxx@127.0.0.1:5672/",
		"amqps://u:p%40ss@rabbit:5671/vhost":      "amqps://u:xxxxx@rabbit:5671/vhost",
		"amqp://guest@127.0.0.1:5672/":            "amqp://guest@127.0.0.1:5672/",
		"amqp://127.0.0.1:5672/":                  "amqp://127.0.0.1:5672/",
		"amqp://u:@host/":                         "amqp://u:@host/",
		"http://metrics:9090/":                    "http://metrics:9090/",
		"amqp://u:pa/ss#word@host:5672/v":         "amqp://u:xxxxx@host:5672/v", // does not parse as a URL
		"amqp://u:1/ss@h/":                        "amqp://u:xxxxx@h/",          // parses, with the password cut: "1" a port
		"amqp://user:sec ret%zz@host/":            "amqp://user:xxxxx@host/",
		"amqp://user:secret":                      "amqp://user:xxxxx", // no host
		"amqp//user:secret@host/":                 "amqp//user:xxxxx@host/",
		"amqp://host:notaport/":                   "amqp://host:xxxxx/",
		"amqp://u:p,w@host/":                      "amqp://u:xxxxx@host/", // a comma in a password
		"amqp://u:p1@h1:5672/,amqp://v:p2@h2/":    "amqp://u:xxxxx@h1:5672/,amqp://v:xxxxx@h2/",
		"amqp://u:p1@h1/, amqps://v:p%2F2@h2/x":   "amqp://u:xxxxx@h1/, amqps://v:xxxxx@h2/x",
		"amqp://h1/,amqp://v:p2@h2/":              "amqp://h1/,amqp://v:xxxxx@h2/",
		"amqp://u:p1@h1/,v:p2@h2/":                "amqp://u:xxxxx@h2/", // second without a scheme: one URL, masked to the last '@'
		"amqp://u:a/b@h1/,amqp://v:c@d/e@h2/vh,x": "amqp://u:xxxxx@h1/,amqp://v:xxxxx@h2/vh,x",
	}
	for in, want := range cases {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
		if got := Value(in); got != want {
			t.Errorf("Value(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPasswords(t *testing.T) {
	cases := map[string][]string{
		"app:db-secret-1@tcp(db:3306)/shop":     {"db-secret-1"},
		"app:p%40ss@tcp(db:3306)/shop":          {"p%40ss", "p@ss"},
		"amqp://app:mq-secret%2F2@rabbit:5672/": {"mq-secret%2F2", "mq-secret/2"},
		"amqp://a:one-1@h1/,amqp://b:two-2@h2/": {"one-1", "two-2"},
		"leak:p@ss:w/rd(x)9Q@tcp(127.0.0.1:1)":  {"p@ss:w/rd(x)9Q"},
		"root@tcp(127.0.0.1:3306)/outbox":       nil,
		"amqp://guest:@127.0.0.1/":              nil,
		"amqp://u:sec%zz@h/":                    {"sec%zz"}, // not decodable: as written only
	}
	for in, want := range cases {
		got := Passwords(in)
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("Passwords(%q) = %q, want %q", in, got, want)
		}
	}
}

// Scrub masks a password as written, percent-encoded, JSON- and Go-quoted;
// short ones are left alone.
func TestScrub(t *testing.T) {
	pw := `p@ss:w/rd(x)9Q"<&>`
	for _, msg := range []string{
		"dial app:" + pw + "@db failed",
		"amqp://app:" + url.QueryEscape(pw) + "@h/",
		"amqp://app:" + url.PathEscape(pw) + "@h/",
		url.UserPassword("app", pw).String(),
		`{"dsn":"app:p@ss:w/rd(x)9Q\"<&>@db"}`,
		`{"dsn":"app:p@ss:w/rd(x)9Q\"\u003c\u0026\u003e@db"}`,
		`--mysql-dsn "app:p@ss:w/rd(x)9Q\"<&>@db"`,
	} {
		got := Scrub(msg, []string{pw})
		if strings.Contains(got, "rd(x)9Q") || !strings.Contains(got, Mask) {
			t.Errorf("Scrub(%q) = %q", msg, got)
		}
	}
	if got := Scrub("abc", []string{"a", "abc"}); got != "abc" {
		t.Errorf("a password shorter than MinSecret was masked: %q", got)
	}
	if got := Scrub("no secret here", nil); got != "no secret here" {
		t.Errorf("Scrub without secrets = %q", got)
	}
}

func TestWriter(t *testing.T) {
	var secrets []string
	var buf bytes.Buffer
	w := Writer(&buf, &secrets)
	if _, err := w.Write([]byte("before: hunter22\n")); err != nil {
		t.Fatal(err)
	}
	secrets = append(secrets, "hunter22")
	n, err := w.Write([]byte("after: hunter22\n"))
	if err != nil || n != len("after: hunter22\n") {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if got := buf.String(); got != "before: hunter22\nafter: xxxxx\n" {
		t.Fatalf("written %q", got)
	}
}

// The errors of the parsers that quote what they were given: the password
// and its pieces are masked, the rest of the message stays.
func TestParseError(t *testing.T) {
	for _, c := range []struct {
		in   string
		err  func(string) error
		keep string // a part of the message that must stay
	}{
		{"leak:p@ss:w/rd(x)9Q@tcp(127.0.0.1:1)", dsnErr, "default addr for network"},
		{"user:a/bcd@tcp(h)", dsnErr, "default addr for network"},
		{"leak:p@ss:w/rd(x)9Q@tcp(127.0.0.1:1/db", dsnErr, "missing closing brace"},
		{"amqp://leak:mq-Pw7/h:k@z@127.0.0.1:1/", amqpErr, "invalid port"},
		{"amqp://leak:pa#Qz9k@127.0.0.1:1/", amqpErr, "invalid port"},
		{"amqp://leak:pass word@127.0.0.1:1/", amqpErr, "whitespace"},
	} {
		err := c.err(c.in)
		if err == nil {
			t.Fatalf("%q parses", c.in)
		}
		got := ParseError(err, c.in).Error()
		pw := Passwords(c.in)[0]
		for i := 0; i+minFragment <= len(pw); i++ {
			if frag := pw[i : i+minFragment]; strings.Contains(got, frag) {
				t.Errorf("ParseError(%q) = %q shows %q of the password %q", err, got, frag, pw)
				break
			}
		}
		t.Logf("%v\n\t-> %s", err, got)
		if !strings.Contains(got, c.keep) {
			t.Errorf("ParseError(%q) = %q lost %q", err, got, c.keep)
		}
	}
	if ParseError(nil, "x") != nil {
		t.Error("ParseError(nil) is not nil")
	}
}

func dsnErr(s string) error { _, err := mysql.ParseDSN(s); return err }

func amqpErr(s string) error { _, err := amqp.ParseURI(s); return err }
