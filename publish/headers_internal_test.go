package publish

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"
)

// headerNumber against an oracle built on big.Rat: for random JSON numbers
// (integers near int64's edges, decimals with up to 25 digits and varied
// exponents, float64 values in shortest and long forms) the AMQP value has
// exactly the JSON number's value: int64 when it is an integer in range,
// else a double whose shortest form is the number, else the text itself.
func TestHeaderNumberIsExact(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	digits := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('0' + r.IntN(10))
		}
		return string(b)
	}
	var inputs []string
	for range 20000 {
		var s string
		switch r.IntN(6) {
		case 0:
			s = strconv.FormatInt(r.Int64(), 10)
		case 1:
			s = strconv.FormatUint(math.MaxInt64+r.Uint64N(1<<20)-(1<<19), 10)
		case 2:
			s = digits(1+r.IntN(12)) + "." + digits(1+r.IntN(12))
		case 3:
			s = digits(1+r.IntN(25)) + "e" + strconv.Itoa(r.IntN(700)-350)
		case 4:
			s = strconv.FormatFloat(math.Float64frombits(r.Uint64()), 'g', -1, 64)
		case 5:
			s = strconv.FormatFloat(r.NormFloat64()*1e6, 'f', 20, 64) // long form of a double
		}
		if s == "NaN" || s == "+Inf" || s == "-Inf" {
			continue
		}
		if r.IntN(2) == 0 && s[0] != '-' {
			s = "-" + s
		}
		inputs = append(inputs, s)
	}
	inputs = append(inputs, "0", "-0", "0.0", "0e5", "1E+2", "9223372036854775807", "-9223372036854775808",
		"9223372036854775807.0", "92233720368547758070e-1", "1e19", "1e-19", "123.456e1")
	counts := map[string]int{}
	for _, s := range inputs {
		var js any
		if err := json.Unmarshal([]byte(s), &js); err != nil {
			continue // leading zeros and the like: not JSON, never decoded
		}
		want, ok := new(big.Rat).SetString(s)
		if !ok {
			t.Fatalf("oracle cannot read %s", s)
		}
		got := headerNumber(json.Number(s))
		counts[fmt.Sprintf("%T", got)]++
		switch g := got.(type) {
		case int64:
			if !want.IsInt() || want.Cmp(new(big.Rat).SetInt64(g)) != 0 {
				t.Fatalf("%s → int64 %d", s, g)
			}
		case float64:
			short, _ := new(big.Rat).SetString(strconv.FormatFloat(g, 'g', -1, 64))
			if want.IsInt() && want.Num().IsInt64() {
				t.Fatalf("%s → double %v, want int64", s, g)
			}
			if short.Cmp(want) != 0 {
				t.Fatalf("%s → double %v, whose shortest form is another value", s, g)
			}
		case string:
			if g != s {
				t.Fatalf("%s → string %q, want the JSON text", s, g)
			}
			if want.IsInt() && want.Num().IsInt64() {
				t.Fatalf("%s → string, want int64", s)
			}
			f, err := strconv.ParseFloat(s, 64)
			short, _ := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
			if err == nil && short.Cmp(want) == 0 {
				t.Fatalf("%s → string, but double %v is exact", s, f)
			}
		default:
			t.Fatalf("%s → %T", s, got)
		}
	}
	t.Logf("inputs by AMQP type: %v", counts)
	if counts["int64"] < 1000 || counts["float64"] < 1000 || counts["string"] < 1000 {
		t.Fatalf("inputs by AMQP type %v: each type should be well exercised", counts)
	}
}

func TestParseDecimalCanonical(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"1", "1.0", true}, {"100", "1e2", true}, {"0.25", "25e-2", true}, {"-0", "0", true},
		{"0.000", "0e-999", true}, {"1.5e-300", "15e-301", true}, {"12", "12.5", false},
		{"-1", "1", false}, {"1e21", "1000000000000000000000", true},
	} {
		da, okA := parseDecimal(tc.a)
		db, okB := parseDecimal(tc.b)
		if !okA || !okB || (da == db) != tc.same {
			t.Errorf("%s vs %s: %+v %+v, same %v", tc.a, tc.b, da, db, tc.same)
		}
	}
	if _, ok := parseDecimal("1e99999999999999999999"); ok {
		t.Error("an exponent beyond int64 parsed as a finite decimal")
	}
	if d, ok := parseDecimal("0e99999999999999999999"); !ok || d != (decimal{}) {
		t.Errorf("zero with a huge exponent: %+v %v", d, ok)
	}
}
