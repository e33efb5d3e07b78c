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
		return pyrepr.Float(x)
	case string:
		return pyrepr.String(x)
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
