package canal

import (
	"bytes"
	"encoding/binary"
	"strings"
)

// This file recognises a statement-logged write into the outbox table: a
// QUERY (or EXECUTE_LOAD_QUERY) event whose statement inserts, replaces or
// loads rows into it. The binlog then carries the statement's text, not the
// rows' values, so the tailer cannot publish them (they are in the table).

// writeTarget returns the table a statement inserts, replaces or loads rows
// into, as it names it (qualifier "" when unqualified), and whether the
// statement is such a write. Leading comments and whitespace are skipped.
// UPDATE and DELETE are not writes here: they create no message (a
// row-logged UPDATE or DELETE of the outbox is not read either). Rows a
// trigger, a view or a stored routine writes into the outbox are not seen
// in the statement either: binlog_format=ROW is the requirement.
func writeTarget(q []byte) (qualifier, table string, ok bool) {
	sc := scanner{s: q}
	kw := strings.ToUpper(sc.word())
	if kw == "SET" && strings.EqualFold(sc.peekWord(), "STATEMENT") {
		// MariaDB's SET STATEMENT var=value[, …] FOR statement.
		for kw != "FOR" && kw != "" {
			sc.skip()
			quoted := sc.i < len(sc.s) && (sc.s[sc.i] == '\'' || sc.s[sc.i] == '"' || sc.s[sc.i] == '`')
			if kw = strings.ToUpper(sc.word()); quoted && kw != "" {
				kw = "'" // a value, never the keyword
			}
		}
		kw = strings.ToUpper(sc.word())
	}
	switch kw {
	case "INSERT", "REPLACE":
		for {
			w := strings.ToUpper(sc.peekWord())
			if w != "LOW_PRIORITY" && w != "DELAYED" && w != "HIGH_PRIORITY" && w != "IGNORE" && w != "INTO" {
				break
			}
			sc.word()
		}
	case "LOAD":
		// LOAD {DATA | XML} [LOW_PRIORITY | CONCURRENT] [LOCAL] INFILE 'file'
		// [REPLACE | IGNORE] INTO TABLE tbl
		for {
			w := strings.ToUpper(sc.word())
			if w == "" {
				return "", "", false
			}
			if w == "INTO" && strings.EqualFold(sc.peekWord(), "TABLE") {
				sc.word()
				break
			}
		}
	default:
		return "", "", false
	}
	return sc.tableName()
}

// writesOutbox reports whether statement q, run with defaultDB as the
// session's database, writes rows into schema.table. Names compare
// case-insensitively: a false match costs a detour through the table, a
// missed one a stranded row.
func writesOutbox(q []byte, defaultDB, schema, table string) bool {
	qual, t, ok := writeTarget(q)
	if !ok || !strings.EqualFold(t, table) {
		return false
	}
	if qual == "" {
		qual = defaultDB
	}
	return strings.EqualFold(qual, schema)
}

// scanner reads SQL words and identifiers, skipping whitespace, comments
// and string literals between them.
type scanner struct {
	s []byte
	i int
}

// skip moves past whitespace and comments (/* */, -- and #). MySQL's
// executable comments (/*! ... */) are read as their content.
func (sc *scanner) skip() {
	for sc.i < len(sc.s) {
		c := sc.s[sc.i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			sc.i++
		case bytes.HasPrefix(sc.s[sc.i:], []byte("/*!")) || bytes.HasPrefix(sc.s[sc.i:], []byte("/*M!")):
			sc.i += bytes.IndexByte(sc.s[sc.i:], '!') + 1
			for sc.i < len(sc.s) && sc.s[sc.i] >= '0' && sc.s[sc.i] <= '9' {
				sc.i++ // the version
			}
		case bytes.HasPrefix(sc.s[sc.i:], []byte("*/")):
			sc.i += 2 // the end of an executable comment
		case bytes.HasPrefix(sc.s[sc.i:], []byte("/*")):
			end := bytes.Index(sc.s[sc.i+2:], []byte("*/"))
			if end < 0 {
				sc.i = len(sc.s)
				return
			}
			sc.i += end + 4
		case c == '#' || isDashComment(sc.s[sc.i:]):
			end := bytes.IndexByte(sc.s[sc.i:], '\n')
			if end < 0 {
				sc.i = len(sc.s)
				return
			}
			sc.i += end + 1
		default:
			return
		}
	}
}

// word returns the next token: a bare word, a quoted identifier's name, a
// string literal's text, or one punctuation character; "" at the end.
func (sc *scanner) word() string {
	sc.skip()
	if sc.i >= len(sc.s) {
		return ""
	}
	switch c := sc.s[sc.i]; {
	case c == '`' || c == '\'' || c == '"':
		return sc.quoted(c)
	case isIdentByte(c):
		start := sc.i
		for sc.i < len(sc.s) && isIdentByte(sc.s[sc.i]) {
			sc.i++
		}
		return string(sc.s[start:sc.i])
	default:
		sc.i++
		return string(c)
	}
}

func (sc *scanner) peekWord() string {
	save := sc.i
	w := sc.word()
	sc.i = save
	return w
}

// quoted reads a quoted token starting at sc.i (the quote q), where a
// doubled quote stands for itself and, in strings, a backslash escapes.
func (sc *scanner) quoted(q byte) string {
	var b strings.Builder
	sc.i++
	for sc.i < len(sc.s) {
		c := sc.s[sc.i]
		sc.i++
		switch {
		case c == '\\' && q != '`' && sc.i < len(sc.s):
			b.WriteByte(sc.s[sc.i])
			sc.i++
		case c == q && sc.i < len(sc.s) && sc.s[sc.i] == q:
			b.WriteByte(q)
			sc.i++
		case c == q:
			return b.String()
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// tableName reads [qualifier.]name.
func (sc *scanner) tableName() (qualifier, table string, ok bool) {
	first := sc.word()
	if first == "" {
		return "", "", false
	}
	sc.skip()
	if sc.i < len(sc.s) && sc.s[sc.i] == '.' {
		sc.i++
		second := sc.word()
		return first, second, second != ""
	}
	return "", first, true
}

// isDashComment reports whether b starts a "-- " comment: two dashes and
// a space or a control character (or the end).
func isDashComment(b []byte) bool {
	return len(b) >= 2 && b[0] == '-' && b[1] == '-' && (len(b) == 2 || b[2] <= ' ')
}

func isIdentByte(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// loadQuery returns the default database and statement of an
// EXECUTE_LOAD_QUERY event (statement-logged LOAD DATA), which go-mysql does
// not decode: the QUERY event's layout with 13 more post-header bytes.
// body is the event without its 19-byte header and without a checksum.
func loadQuery(body []byte) (db, query []byte, ok bool) {
	const postHeader = 13 + 13
	if len(body) < postHeader {
		return nil, nil, false
	}
	dbLen := int(body[8])
	statusLen := int(binary.LittleEndian.Uint16(body[11:]))
	pos := postHeader + statusLen
	if len(body) < pos+dbLen+1 {
		return nil, nil, false
	}
	return body[pos : pos+dbLen], body[pos+dbLen+1:], true
}
