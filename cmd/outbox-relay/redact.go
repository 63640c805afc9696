package main

import (
	"flag"
	"net/url"
	"strings"
)

// mask replaces passwords in what we print.
const mask = "xxxxx"

// redactDSN returns a go-sql-driver DSN
// ([user[:password]@][net[(addr)]]/dbname[?params]) with its password
// replaced by "xxxxx". It splits the DSN the way the driver does: the last
// '/' ends the address, the last '@' before it ends the credentials, and the
// first ':' in those separates user and password, so passwords containing
// '@', ':' or '/' are masked whole.
func redactDSN(dsn string) string {
	start, end, ok := dsnPassword(dsn)
	if !ok || start == end {
		return dsn
	}
	return dsn[:start] + mask + dsn[end:]
}

// dsnPassword returns the byte range of the password in dsn.
func dsnPassword(dsn string) (start, end int, ok bool) {
	slash := strings.LastIndexByte(dsn, '/')
	if slash <= 0 {
		return 0, 0, false
	}
	at := strings.LastIndexByte(dsn[:slash], '@')
	if at < 0 {
		return 0, 0, false
	}
	colon := strings.IndexByte(dsn[:at], ':')
	if colon < 0 {
		return 0, 0, false
	}
	return colon + 1, at, true
}

// redactURL returns an AMQP (or any) URL with the password of its userinfo
// replaced by "xxxxx". A URL that does not parse is masked between the
// first ':' after "scheme://" and the last '@' before the path, to err on
// the side of hiding too much.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, has := u.User.Password(); !has {
			return s
		}
		return u.Redacted()
	}
	start, end, ok := urlPassword(s)
	if !ok {
		return s
	}
	return s[:start] + mask + s[end:]
}

// urlPassword finds the password in scheme://user:pass@host/... without
// parsing the URL (for URLs url.Parse rejects, e.g. an unescaped '/' or '#'
// in the password).
func urlPassword(s string) (start, end int, ok bool) {
	i := strings.Index(s, "://")
	if i < 0 {
		return 0, 0, false
	}
	rest := s[i+3:]
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return 0, 0, false
	}
	colon := strings.IndexByte(rest[:at], ':')
	if colon < 0 || colon+1 == at {
		return 0, 0, false
	}
	return i + 3 + colon + 1, i + 3 + at, true
}

// redact masks the password in a DSN or URL, whichever s is.
func redact(s string) string {
	if strings.Contains(s, "://") {
		return redactURL(s)
	}
	return redactDSN(s)
}

// secretFlag reports whether a flag holds a DSN or URL, whose password must
// never be printed. By convention such flags end in "-dsn" or "-url".
func secretFlag(name string) bool {
	return strings.HasSuffix(name, "-dsn") || strings.HasSuffix(name, "-url")
}

// displayValue is a flag value as it may be printed.
func displayValue(name, value string) string {
	if secretFlag(name) {
		return redact(value)
	}
	return value
}

// passwords returns the passwords of fs's DSN and URL flags, for scrub.
func passwords(fs *flag.FlagSet) []string {
	var out []string
	fs.VisitAll(func(f *flag.Flag) {
		if !secretFlag(f.Name) {
			return
		}
		v := f.Value.String()
		if strings.Contains(v, "://") {
			if u, err := url.Parse(v); err == nil && u.User != nil {
				if p, ok := u.User.Password(); ok && p != "" {
					out = append(out, p)
				}
				return
			}
			if s, e, ok := urlPassword(v); ok {
				out = append(out, v[s:e])
			}
			return
		}
		if s, e, ok := dsnPassword(v); ok && e > s {
			out = append(out, v[s:e])
		}
	})
	return out
}

// scrub masks every occurrence of the given passwords in msg: the last line
// of defence for errors from libraries that might quote a DSN or URL. Very
// short passwords are skipped, as masking them would garble the message
// (and they are not worth hiding anyway).
func scrub(msg string, secrets []string) string {
	for _, s := range secrets {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, mask)
		}
	}
	return msg
}
