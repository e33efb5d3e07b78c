// Package pyrepr writes values as Python's repr writes them, so that egpu-kube-scheduler's
// messages are word for word those of egpu's Python parts (the shared cases under tests/
// hold both sides to them).
package pyrepr

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// String is text as Python's repr writes a str: single quotes, or double quotes when the
// text has a single quote and no double quote; backslash, the quote, tab, newline and
// carriage return escaped, other control characters as \xNN.
func String(text string) string {
	quote := '\''
	if strings.ContainsRune(text, '\'') && !strings.ContainsRune(text, '"') {
		quote = '"'
	}
	var b strings.Builder
	b.WriteRune(quote)
	for _, r := range text {
		switch {
		case r == quote || r == '\\':
			b.WriteRune('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteRune(quote)
	return b.String()
}

// Float is Python's repr of a float: the shortest digits that read back, fixed-point
// with at least one decimal for exponents -4..15, else d.ddde+XX.
func Float(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	sci := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(sci[strings.IndexByte(sci, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return sci
	}
	fixed := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(fixed, ".") {
		fixed += ".0"
	}
	return fixed
}
