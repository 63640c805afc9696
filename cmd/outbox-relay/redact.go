package main

import (
	"flag"
	"strings"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// secretFlag reports whether a flag holds a DSN or URL, whose password must
// never be printed. By convention such flags end in "-dsn" or "-url".
func secretFlag(name string) bool {
	return strings.HasSuffix(name, "-dsn") || strings.HasSuffix(name, "-url")
}

// displayValue is a flag value as it may be printed: a DSN or URL with its
// passwords masked.
func displayValue(name, value string) string {
	if secretFlag(name) {
		return redact.Value(value)
	}
	return value
}

// passwords returns the passwords of fs's DSN and URL flags (every URL of a
// list) and those the password files hold as the command starts (a password
// rotated later is masked by the DSN and URL rules only), for redact.Scrub
// and redact.Writer.
func passwords(fs *flag.FlagSet) []string {
	var out []string
	fs.VisitAll(func(f *flag.Flag) {
		switch {
		case secretFlag(f.Name):
			out = append(out, redact.Passwords(f.Value.String())...)
		case strings.HasSuffix(f.Name, "-password-file") && f.Value.String() != "":
			if p, err := redact.ReadPasswordFile(f.Value.String()); err == nil {
				out = append(out, p)
			}
		}
	})
	return out
}
