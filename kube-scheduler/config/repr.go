package config

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Values in messages are written as Python writes them (repr and str), so that a config is
// refused by egpu-kube-scheduler in the words egpu/config.py refuses it with
// (tests/unit/config_cases.yaml holds both to it).

// ReprString is text as Python's repr writes a str: single quotes, or double quotes when the
// text has a single quote and no double quote; backslash, the quote, tab, newline and
// carriage return escaped, other control characters as \xNN.
func ReprString(text string) string {
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

// reprFloat is Python's repr of a float: the shortest digits that read back, fixed-point
// with at least one decimal for exponents -4..15, else d.ddde+XX.
func reprFloat(f float64) string {
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

// repr is Python's repr of a value of decodeYAML.
func repr(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case *big.Int:
		return x.String()
	case float64:
		return reprFloat(x)
	case string:
		return ReprString(x)
	case timestamp:
		return reprTimestamp(string(x))
	case []any:
		parts := make([]string, len(x))
		for i, item := range x {
			parts[i] = repr(item)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case mapping:
		parts := make([]string, len(x))
		for i, p := range x {
			parts[i] = repr(p.key) + ": " + repr(p.value)
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v)
}

// str is Python's str of a value: repr but for text, which stands as it is, and a date, which
// Python writes as its ISO text.
func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case timestamp:
		return string(x)
	}
	return repr(v)
}

// reprTimestamp: a date as Python writes a datetime.date; a date with a time as its text
// (PyYAML's datetime.datetime, which no config key takes).
func reprTimestamp(text string) string {
	if len(text) == len("2001-12-14") {
		y, _ := strconv.Atoi(text[:4])
		m, _ := strconv.Atoi(text[5:7])
		d, _ := strconv.Atoi(text[8:])
		return fmt.Sprintf("datetime.date(%d, %d, %d)", y, m, d)
	}
	return text
}
