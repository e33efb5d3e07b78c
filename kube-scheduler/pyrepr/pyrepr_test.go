package pyrepr

import (
	"math"
	"testing"
)

// The texts are Python 3.11's repr of the same values. Bugs caught: a quote, an escape or a
// float's notation written otherwise than Python writes it, so that the plugin's and the
// config reader's messages part from the Python parts' words.
func TestValuesAreWrittenAsPythonWritesThem(t *testing.T) {
	for text, want := range map[string]string{
		"a'b": `"a'b"`, `a'b"c`: `'a\'b"c'`, "\t\n\x01\x7f": `'\t\n\x01\x7f'`,
		"plain": "'plain'", `back\slash`: `'back\\slash'`,
	} {
		if got := String(text); got != want {
			t.Errorf("String(%q) = %s, want %s", text, got, want)
		}
	}
	for _, c := range []struct {
		f    float64
		want string
	}{{1e16, "1e+16"}, {1e15, "1000000000000000.0"}, {0.0001, "0.0001"}, {0.00001, "1e-05"},
		{100, "100.0"}, {1.5e300, "1.5e+300"}, {math.Copysign(0, -1), "-0.0"},
		{123456789.125, "123456789.125"}, {math.Inf(1), "inf"}, {math.NaN(), "nan"}} {
		if got := Float(c.f); got != c.want {
			t.Errorf("Float(%v) = %s, want %s", c.f, got, c.want)
		}
	}
}
