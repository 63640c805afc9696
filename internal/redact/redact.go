package redact

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// Mask is what a password is replaced with.
const Mask = "xxxxx"

// MinSecret is the length below which Scrub leaves a password alone: masking
// every "ab" in a message would garble it and hide nothing worth hiding.
const MinSecret = 4

// minFragment is the shortest piece of a password ParseError masks.
const minFragment = 3

// span is a byte range [start, end) of a string.
type span struct{ start, end int }

// Value returns s, a DSN or an AMQP URL (or a list of URLs), with its
// passwords masked: a string with "://" is taken for URLs, any other for a
// DSN.
func Value(s string) string {
	return mask(s, passwordSpans(s))
}

// DSN returns a go-sql-driver DSN with its password masked.
func DSN(dsn string) string { return mask(dsn, dsnSpans(dsn)) }

// URL returns an AMQP URL, or a comma-separated list of URLs, with the
// password of each masked.
func URL(s string) string { return mask(s, urlSpans(s)) }

// Passwords returns the passwords in s (a DSN, a URL or a list of URLs) as
// written and, where that differs, percent-decoded: what Scrub needs. Empty
// passwords are left out.
func Passwords(s string) []string {
	var out []string
	for _, sp := range passwordSpans(s) {
		p := s[sp.start:sp.end]
		out = append(out, p)
		if d, err := url.PathUnescape(p); err == nil && d != p {
			out = append(out, d)
		}
	}
	return out
}

// ParseError returns err, the error of a parser that refused s (a DSN or
// URL), with s itself masked where it is quoted and every piece of its
// password (minFragment bytes or longer) masked where the parser quotes one
// it cut out: go-sql-driver's "default addr for network 'ss:w' unknown", or
// net/url's `invalid port ":pa" after host` for a password holding a '/'
// (net/url's quotes are masked whole).
// The result does not wrap err: its text is all that matters of a parse
// failure, and the original must not be printed.
func ParseError(err error, s string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		// net/url quotes the input as far as it read it, and in its cause
		// the piece it refused (`invalid port ":pa" after host`).
		clean := fmt.Sprintf("%s %q: %s", ue.Op, Value(s), quoted.ReplaceAllString(ue.Err.Error(), `"`+Mask+`"`))
		msg = strings.Replace(msg, ue.Error(), clean, 1)
	}
	msg = strings.ReplaceAll(msg, s, Value(s))
	for _, sp := range passwordSpans(s) {
		msg = maskFragments(msg, s[sp.start:sp.end])
	}
	return errors.New(msg)
}

// quoted matches a Go-quoted string.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// Scrub returns msg with every secret of MinSecret bytes or more masked, in
// each form it may be printed in.
func Scrub(msg string, secrets []string) string {
	for _, f := range forms(secrets) {
		msg = strings.ReplaceAll(msg, f, Mask)
	}
	return msg
}

// Writer returns a writer that scrubs each Write of the secrets *secrets
// holds at that moment, then writes to w. Each Write is scrubbed on its own,
// so a writer that logs one entry per Write (zap) is covered whole. *secrets
// may be filled after Writer is called, but not while writes run.
func Writer(w io.Writer, secrets *[]string) io.Writer {
	return &scrubWriter{w: w, secrets: secrets}
}

type scrubWriter struct {
	w       io.Writer
	secrets *[]string
}

// Write writes p scrubbed and reports len(p) written when the scrubbed text
// was written whole.
func (s *scrubWriter) Write(p []byte) (int, error) {
	if len(*s.secrets) == 0 {
		return s.w.Write(p)
	}
	out := Scrub(string(p), *s.secrets)
	if _, err := io.WriteString(s.w, out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// forms returns every printed form of each secret, longest first, so that an
// escaped form is replaced before a shorter one it contains.
func forms(secrets []string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(f string) {
		if f != "" && !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	for _, s := range secrets {
		if len(s) < MinSecret {
			continue
		}
		add(s)
		add(url.QueryEscape(s))
		add(url.PathEscape(s))
		add(strings.TrimPrefix(url.UserPassword("", s).String(), ":"))
		quoted := strconv.Quote(s)
		add(quoted[1 : len(quoted)-1])
		if js, err := json.Marshal(s); err == nil { // escapes <, > and & too
			add(string(js[1 : len(js)-1]))
		}
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false) // as zap and most JSON writers
		if enc.Encode(s) == nil {
			js := strings.TrimSuffix(b.String(), "\n")
			add(js[1 : len(js)-1])
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// maskFragments masks, left to right, each longest run of msg of
// minFragment bytes or more that occurs in secret.
func maskFragments(msg, secret string) string {
	if len(secret) < minFragment {
		return msg
	}
	var b strings.Builder
	for i := 0; i < len(msg); {
		n := 0
		for l := min(len(secret), len(msg)-i); l >= minFragment; l-- {
			if strings.Contains(secret, msg[i:i+l]) {
				n = l
				break
			}
		}
		if n == 0 {
			b.WriteByte(msg[i])
			i++
			continue
		}
		b.WriteString(Mask)
		i += n
	}
	return b.String()
}

// mask replaces the spans of s, which are ordered and disjoint, with Mask.
func mask(s string, spans []span) string {
	if len(spans) == 0 {
		return s
	}
	var b strings.Builder
	last := 0
	for _, sp := range spans {
		b.WriteString(s[last:sp.start])
		b.WriteString(Mask)
		last = sp.end
	}
	b.WriteString(s[last:])
	return b.String()
}

func passwordSpans(s string) []span {
	if strings.Contains(s, "://") {
		return urlSpans(s)
	}
	return dsnSpans(s)
}

// dsnSpans returns the password of dsn, if any. For a DSN the driver
// parses, its split: the last '/' ends the address, the last '@' before it
// the credentials, whose first ':' starts the password. For one it does not
// parse, the span from the first ':' to the last '@' (see loose).
func dsnSpans(dsn string) []span {
	if _, err := mysql.ParseDSN(dsn); err != nil {
		return loose(dsn, 0)
	}
	slash := strings.LastIndexByte(dsn, '/')
	if slash < 0 {
		return nil
	}
	at := strings.LastIndexByte(dsn[:slash], '@')
	if at < 0 {
		return nil
	}
	colon := strings.IndexByte(dsn[:at], ':')
	if colon < 0 || colon+1 == at {
		return nil
	}
	return []span{{colon + 1, at}}
}

// nextURL matches the start of the next URL of a comma-separated list: the
// comma, spaces, and a scheme with "://".
var nextURL = regexp.MustCompile(`,\s*[A-Za-z][A-Za-z0-9+.\-]*://`)

// urlSpans returns the password of each URL of the list s. A comma starts a
// new URL only when a scheme and "://" follow it; a comma elsewhere (in a
// password) stays in the URL it is in, whose password is then masked whole
// with it.
func urlSpans(s string) []span {
	var out []span
	begin := 0
	for _, m := range nextURL.FindAllStringIndex(s, -1) {
		out = append(out, urlSpan(s, begin, m[0])...)
		begin = m[0] + 1
	}
	return append(out, urlSpan(s, begin, len(s))...)
}

// urlSpan returns the password of the one URL s[begin:end]: between the
// first ':' after "scheme://" and the last '@'. That is the password of a
// well-formed URL, and whole for one whose password holds an unescaped
// '@', '/', '?' or '#' (which url.Parse would split elsewhere).
func urlSpan(s string, begin, end int) []span {
	if i := strings.Index(s[begin:end], "://"); i >= 0 {
		begin += i + 3
	}
	return loose(s[:end], begin)
}

// loose returns the password of s[from:] read loosely: from the first ':'
// to the last '@'; without an '@', from the first ':' to the next '/', '?',
// '#', '(' or ')' unless that is a port number (host:5672) or nothing.
func loose(s string, from int) []span {
	colon := strings.IndexByte(s[from:], ':')
	if colon < 0 {
		return nil
	}
	start := from + colon + 1
	if at := strings.LastIndexByte(s, '@'); at >= start {
		if at == start {
			return nil
		}
		return []span{{start, at}}
	}
	end := len(s)
	if i := strings.IndexAny(s[start:], "/?#()"); i >= 0 {
		end = start + i
	}
	if end == start || isDigits(s[start:end]) {
		return nil
	}
	return []span{{start, end}}
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// ReadPasswordFile returns the password a file holds: its content without
// trailing line breaks (\n, \r\n; echo adds one). An unreadable or empty
// file is an error naming the path, never the content; the caller adds
// which setting named the file.
func ReadPasswordFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err // a *PathError: the operation, the path and the cause
	}
	p := strings.TrimRight(string(data), "\r\n")
	if p == "" {
		return "", fmt.Errorf("%s is empty: write the password into it", path)
	}
	return p, nil
}
