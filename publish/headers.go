package publish

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// CreatedAtLayout is the form of the x-created-at header: created_at in
// RFC 3339, UTC, with exactly six fractional digits, e.g.
// 2026-11-23T13:45:01.123456Z. The AMQP timestamp property holds whole
// seconds only; this header keeps the microseconds the column has.
const CreatedAtLayout = "2006-01-02T15:04:05.000000Z"

// FormatCreatedAt returns t in CreatedAtLayout (converted to UTC).
func FormatCreatedAt(t time.Time) string { return t.UTC().Format(CreatedAtLayout) }

// maxHeaderDepth is how deeply objects and arrays may nest in a header
// value (a value that is an object is one level). amqp091-go consumers
// refuse a field table nested deeper than 32 and close their connection,
// so a deeper message would be redelivered to them forever.
const maxHeaderDepth = 32

// recordHeaders decodes the headers column into an AMQP table (never nil),
// each JSON value mapped by headerField. docs/wire.md has the table.
func recordHeaders(raw []byte) (amqp.Table, error) {
	table := amqp.Table{}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return table, nil
	}
	if trimmed[0] != '{' {
		return nil, badRecord("headers are not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, badRecord("headers are not valid JSON: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, badRecord("headers have data after the JSON object")
	}
	for k, v := range obj {
		f, err := headerField(v, 0)
		if err != nil {
			return nil, badRecord("header %q: %v", k, err)
		}
		table[k] = f
	}
	return table, nil
}

// headerField maps one decoded JSON value (json.Number for numbers) at
// nesting depth depth to the AMQP field value that carries it exactly:
//
//	string → string (S); true/false → bool (t); null → nil (V, void);
//	number → headerNumber (l, d or S); object → Table (F); array → []any (A).
func headerField(v any, depth int) (any, error) {
	switch v := v.(type) {
	case nil, string, bool:
		return v, nil
	case json.Number:
		return headerNumber(v), nil
	case map[string]any:
		if depth >= maxHeaderDepth {
			return nil, fmt.Errorf("nested deeper than %d levels", maxHeaderDepth)
		}
		t := make(amqp.Table, len(v))
		for k, e := range v {
			f, err := headerField(e, depth+1)
			if err != nil {
				return nil, err
			}
			t[k] = f
		}
		return t, nil
	case []any:
		if depth >= maxHeaderDepth {
			return nil, fmt.Errorf("nested deeper than %d levels", maxHeaderDepth)
		}
		a := make([]any, len(v))
		for i, e := range v {
			f, err := headerField(e, depth+1)
			if err != nil {
				return nil, err
			}
			a[i] = f
		}
		return a, nil
	}
	return nil, fmt.Errorf("unsupported JSON value of type %T", v)
}

// headerNumber returns the AMQP value that carries the JSON number n
// without changing its value:
//
//   - int64 when n is an integer within int64's range, however it is
//     spelled (3, 3.0, 3e0, 300e-2): JSON does not tell 3 from 3.0, and
//     neither do MySQL's binary JSON nor the binlog, so the type follows the
//     value, the same in binlog and poll mode;
//   - float64 when the shortest form of the float64 nearest to n is n's
//     decimal value (0.25, 0.1, 1e21, 5e-324): every JSON parser reads that
//     double back from n;
//   - otherwise n's JSON text as a string (18446744073709551615, 1e400,
//     0.1000000000000000000001), which is exact, where a double would change
//     the value in silence.
func headerNumber(n json.Number) any {
	d, ok := parseDecimal(string(n))
	if !ok {
		return string(n)
	}
	if i, ok := d.int64(); ok {
		return i
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil { // out of float64's range
		return string(n)
	}
	if fd, ok := parseDecimal(strconv.FormatFloat(f, 'g', -1, 64)); ok && fd == d {
		return f
	}
	return string(n)
}

// decimal is a finite decimal number in one canonical form, so that two
// spellings of one value compare equal with ==: the value is
// ±digits × 10^exp, with digits free of leading and trailing zeros.
// Zero is the zero decimal (digits "", whatever the sign).
type decimal struct {
	neg    bool
	digits string
	exp    int64
}

// maxDecimalExp bounds the exponents parseDecimal works with, far outside
// float64's range (about 10^±324) and int64's (10^19), so the adjustments
// below cannot overflow.
const maxDecimalExp = 1 << 40

// parseDecimal reads a JSON number, or what strconv.FormatFloat writes. ok
// is false when the exponent is beyond ±maxDecimalExp and the value is not
// zero: no int64 or float64 holds such a number.
func parseDecimal(s string) (d decimal, ok bool) {
	if strings.HasPrefix(s, "-") {
		d.neg, s = true, s[1:]
	}
	mant, expText := s, ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, expText = s[:i], s[i+1:]
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	all := strings.TrimLeft(intPart+frac, "0")
	if all == "" {
		return decimal{}, true
	}
	if expText != "" {
		e, err := strconv.ParseInt(expText, 10, 64)
		if err != nil || e > maxDecimalExp || e < -maxDecimalExp {
			return decimal{}, false
		}
		d.exp = e
	}
	d.digits = strings.TrimRight(all, "0")
	d.exp += int64(len(all)-len(d.digits)) - int64(len(frac))
	return d, true
}

// int64 returns d as an int64 when it is an integer within int64's range.
func (d decimal) int64() (int64, bool) {
	if d.digits == "" {
		return 0, true
	}
	// int64 has at most 19 digits.
	if d.exp < 0 || int64(len(d.digits))+d.exp > 19 {
		return 0, false
	}
	s := d.digits + strings.Repeat("0", int(d.exp))
	if d.neg {
		s = "-" + s
	}
	i, err := strconv.ParseInt(s, 10, 64)
	return i, err == nil
}
