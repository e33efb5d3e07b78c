package config

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/egpu/egpu/kube-scheduler/pyrepr"
)

// Values in messages are written as Python writes them (repr and str, package pyrepr), so that
// a config is refused by egpu-kube-scheduler in the words egpu/config.py refuses it with
// (tests/unit/config_cases.yaml holds both to it).

// reprMax bounds repr's text: a value built of aliases can be far larger written out than in
// the file (Python would write it all; a message needs its start).
const reprMax = 10000

// repr is Python's repr of a value of decodeYAML, cut after reprMax characters with "...".
func repr(v any) string {
	var b strings.Builder
	reprTo(&b, v)
	if b.Len() > reprMax {
		return b.String()[:reprMax] + "..."
	}
	return b.String()
}

func reprTo(b *strings.Builder, v any) {
	if b.Len() > reprMax {
		return
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("None")
	case bool:
		if x {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case *big.Int:
		b.WriteString(x.String())
	case float64:
		b.WriteString(pyrepr.Float(x))
	case string:
		b.WriteString(pyrepr.String(x))
	case timestamp:
		b.WriteString(reprTimestamp(string(x)))
	case []any:
		b.WriteString("[")
		for i, item := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			reprTo(b, item)
		}
		b.WriteString("]")
	case mapping:
		b.WriteString("{")
		for i, p := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			reprTo(b, p.key)
			b.WriteString(": ")
			reprTo(b, p.value)
		}
		b.WriteString("}")
	default:
		fmt.Fprint(b, v)
	}
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
