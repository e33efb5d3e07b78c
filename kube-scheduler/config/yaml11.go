package config

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// The values a YAML document reads to, as PyYAML's SafeLoader constructs them (egpu/config.py
// reads the config with it): YAML 1.1 scalars (yes/on are booleans, 0755 is octal, 1:30 is
// 90, 2001-12-14 is a date), merge keys (<<) flattened, mappings in their document order.
// yaml.v3 parses the text; the scalars are resolved here, by PyYAML's rules, because v3
// resolves them by YAML 1.2's (where yes is text).
//
// A value is one of: nil, bool, *big.Int, float64, string, timestamp, []any, mapping.

// mapping is a YAML mapping in document order (a Python dict: a key given again by a merge
// keeps its first place and takes the later value).
type mapping []pair

type pair struct {
	key, value any
}

// timestamp is a YAML 1.1 timestamp scalar (PyYAML: a datetime.date or datetime.datetime).
type timestamp string

func (m mapping) get(key string) (any, bool) {
	for _, p := range m {
		if k, ok := p.key.(string); ok && k == key {
			return p.value, true
		}
	}
	return nil, false
}

// keyID is a key's identity for a mapping: its type and its value as repr writes it (two keys
// are the same key when both match).
func keyID(key any) string {
	return fmt.Sprintf("%T %s", key, repr(key))
}

// builder makes a mapping in document order, a key set again keeping its first place.
type builder struct {
	m  mapping
	at map[string]int
}

func (b *builder) set(key, value any) {
	if b.at == nil {
		b.at = map[string]int{}
	}
	id := keyID(key)
	if i, ok := b.at[id]; ok {
		b.m[i].value = value
		return
	}
	b.at[id] = len(b.m)
	b.m = append(b.m, pair{key, value})
}

// PyYAML's implicit resolvers (yaml/resolver.py), for plain scalars.
var (
	reBool = regexp.MustCompile(`^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE` +
		`|on|On|ON|off|Off|OFF)$`)
	reFloat = regexp.MustCompile(`^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?` +
		`|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?` +
		`|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*` +
		`|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$`)
	reInt = regexp.MustCompile(`^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)` +
		`|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$`)
	reNull      = regexp.MustCompile(`^(?:~|null|Null|NULL|)$`)
	reTimestamp = regexp.MustCompile(`^(?:[0-9]{4}-[0-9]{2}-[0-9]{2}` +
		`|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}` +
		`(?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?)$`)
	trueWords = map[string]bool{"yes": true, "true": true, "on": true}
)

// decodeYAML reads one YAML document as PyYAML's SafeLoader with egpu's unique-key check
// would (egpu/config.py _UniqueKeyLoader): an error for text that is not YAML, for more than
// one document, and for a key given twice in one mapping.
func decodeYAML(text string) (any, error) {
	if err := tabsPyYAMLRefuses(text); err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(strings.NewReader(text))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil // no document: None
		}
		return nil, err
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, err
		}
		return nil, errors.New("expected a single document in the stream")
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	d := decoder{built: map[*yaml.Node]any{}, building: map[*yaml.Node]bool{}}
	return d.construct(doc.Content[0])
}

// maxNodes bounds the nodes one document builds (an alias's target is built once and
// shared, as PyYAML shares it): more than a ConfigMap's 1 MiB can write out.
const maxNodes = 1 << 20

// decoder builds a document's values: each node once (an alias shares its anchor's value), a
// node that refers to itself refused (PyYAML would build a value that contains itself, which
// no config key takes).
type decoder struct {
	built    map[*yaml.Node]any
	building map[*yaml.Node]bool
	count    int
}

func (d *decoder) construct(n *yaml.Node) (any, error) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if v, ok := d.built[n]; ok {
		return v, nil
	}
	if d.building[n] {
		return nil, fmt.Errorf("line %d: an alias refers to the node that holds it", n.Line)
	}
	if d.count++; d.count > maxNodes {
		return nil, fmt.Errorf("more than %d nodes", maxNodes)
	}
	d.building[n] = true
	defer delete(d.building, n)
	var v any
	var err error
	switch n.Kind {
	case yaml.ScalarNode:
		v, err = scalar(n)
	case yaml.SequenceNode:
		v, err = d.sequence(n)
	case yaml.MappingNode:
		v, err = d.constructMapping(n)
	default:
		err = fmt.Errorf("line %d: unexpected YAML node", n.Line)
	}
	if err != nil {
		return nil, err
	}
	d.built[n] = v
	return v, nil
}

// collectionTag refuses an explicit tag on a collection other than its own (PyYAML's safe
// constructors: !!str on a mapping, or a local tag, has none).
func collectionTag(n *yaml.Node, own string) error {
	if n.Style&yaml.TaggedStyle != 0 && n.Tag != own {
		return fmt.Errorf("line %d: could not determine a constructor for the tag %s", n.Line,
			n.Tag)
	}
	return nil
}

func (d *decoder) sequence(n *yaml.Node) ([]any, error) {
	if err := collectionTag(n, "!!seq"); err != nil {
		return nil, err
	}
	items := make([]any, 0, len(n.Content))
	for _, c := range n.Content {
		v, err := d.construct(c)
		if err != nil {
			return nil, err
		}
		items = append(items, v)
	}
	return items, nil
}

func isMergeKey(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Style == 0 && n.Value == "<<"
}

// constructMapping: the merged pairs first (later sources of a merge list first, so that
// earlier ones win), then the mapping's own pairs (PyYAML's flatten_mapping); a key of the
// mapping's own given twice is an error (the merged ones may be overridden).
func (d *decoder) constructMapping(n *yaml.Node) (mapping, error) {
	if err := collectionTag(n, "!!map"); err != nil {
		return nil, err
	}
	var merged, own builder
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		keyNode, valueNode := n.Content[i], n.Content[i+1]
		if isMergeKey(keyNode) {
			sources := []*yaml.Node{valueNode}
			if target := resolveAlias(valueNode); target.Kind == yaml.SequenceNode {
				sources = target.Content
			}
			var parts []mapping
			for _, src := range sources {
				v, err := d.construct(src)
				if err != nil {
					return nil, err
				}
				m, ok := v.(mapping)
				if !ok {
					return nil, fmt.Errorf("line %d: expected a mapping for merging", src.Line)
				}
				parts = append(parts, m)
			}
			for j := len(parts) - 1; j >= 0; j-- {
				for _, p := range parts[j] {
					merged.set(p.key, p.value)
				}
			}
			continue
		}
		key, err := d.construct(keyNode)
		if err != nil {
			return nil, err
		}
		switch key.(type) {
		case mapping, []any:
			return nil, fmt.Errorf("line %d: found unhashable key", keyNode.Line)
		}
		id := keyID(key)
		if seen[id] {
			return nil, fmt.Errorf("line %d: key %s is given twice", keyNode.Line, repr(key))
		}
		seen[id] = true
		value, err := d.construct(valueNode)
		if err != nil {
			return nil, err
		}
		own.set(key, value)
	}
	for _, p := range own.m {
		merged.set(p.key, p.value)
	}
	if merged.m == nil {
		return mapping{}, nil
	}
	return merged.m, nil
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func scalar(n *yaml.Node) (any, error) {
	quoted := n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|
		yaml.FoldedStyle) != 0
	if n.Style&yaml.TaggedStyle != 0 {
		switch n.Tag {
		case "!!str":
			return n.Value, nil
		case "!!int":
			return yamlInt(n.Value, n.Line)
		case "!!float":
			return yamlFloat(n.Value, n.Line)
		case "!!bool":
			if !reBool.MatchString(n.Value) {
				return nil, fmt.Errorf("line %d: %q is not a boolean", n.Line, n.Value)
			}
			return trueWords[strings.ToLower(n.Value)], nil
		case "!!null":
			return nil, nil
		}
		return nil, fmt.Errorf("line %d: could not determine a constructor for the tag %s",
			n.Line, n.Tag)
	}
	if quoted {
		return n.Value, nil
	}
	v := n.Value
	switch {
	case v == "=" || v == "<<": // PyYAML's value and merge tags, which build no value
		return nil, fmt.Errorf("line %d: could not determine a constructor for %q", n.Line, v)
	case reBool.MatchString(v):
		return trueWords[strings.ToLower(v)], nil
	case reInt.MatchString(v):
		return yamlInt(v, n.Line)
	case reFloat.MatchString(v):
		return yamlFloat(v, n.Line)
	case reNull.MatchString(v):
		return nil, nil
	case reTimestamp.MatchString(v):
		// PyYAML builds a date: one that does not exist (2026-13-01) is an error
		if _, err := time.Parse("2006-1-2", v[:strings.IndexAny(v+"Tt \t", "Tt \t")]); err != nil {
			return nil, fmt.Errorf("line %d: %q is not a date: %v", n.Line, v, err)
		}
		return timestamp(v), nil
	}
	return v, nil
}

// yamlInt is PyYAML's construct_yaml_int: underscores dropped, 0b binary, 0x hex, a leading 0
// octal, a:b:c base 60.
func yamlInt(text string, line int) (*big.Int, error) {
	v := strings.ReplaceAll(text, "_", "")
	sign := int64(1)
	if strings.HasPrefix(v, "-") {
		sign = -1
	}
	v = strings.TrimLeft(v, "+-")
	out := new(big.Int)
	ok := true
	switch {
	case v == "0":
	case strings.HasPrefix(v, "0b"):
		_, ok = out.SetString(v[2:], 2)
	case strings.HasPrefix(v, "0x"):
		_, ok = out.SetString(v[2:], 16)
	case strings.HasPrefix(v, "0"):
		_, ok = out.SetString(v, 8)
	case strings.Contains(v, ":"):
		for _, part := range strings.Split(v, ":") {
			digit, err := strconv.ParseInt(part, 10, 64)
			if err != nil {
				ok = false
				break
			}
			out.Mul(out, big.NewInt(60))
			out.Add(out, big.NewInt(digit))
		}
	default:
		_, ok = out.SetString(v, 10)
	}
	if !ok {
		return nil, fmt.Errorf("line %d: %q is not an integer", line, text)
	}
	return out.Mul(out, big.NewInt(sign)), nil
}

// yamlFloat is PyYAML's construct_yaml_float.
func yamlFloat(text string, line int) (float64, error) {
	v := strings.ToLower(strings.ReplaceAll(text, "_", ""))
	sign := 1.0
	if strings.HasPrefix(v, "-") {
		sign = -1
	}
	v = strings.TrimLeft(v, "+-")
	switch {
	case v == ".inf":
		return sign * math.Inf(1), nil
	case v == ".nan":
		return math.NaN(), nil
	case strings.Contains(v, ":"):
		out := 0.0
		for _, part := range strings.Split(v, ":") {
			digit, err := strconv.ParseFloat(part, 64)
			if err != nil {
				return 0, fmt.Errorf("line %d: %q is not a number", line, text)
			}
			out = out*60 + digit
		}
		return sign * out, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("line %d: %q is not a number", line, text)
	}
	return sign * f, nil
}

// tabsPyYAMLRefuses: PyYAML's scanner skips only spaces between tokens and ends a plain scalar
// at a tab, so a tab anywhere but in a quoted scalar, a comment or a block scalar's text is an
// error there ("found character '\t' that cannot start any token"), where yaml.v3 takes it as
// a space. The file is read line by line: quotes (carried across lines), comments, and the
// lines of a block scalar (| or >), which are indented deeper than the line that starts it.
func tabsPyYAMLRefuses(text string) error {
	var quote byte
	blockIndent := -1 // the indentation of the line that started a block scalar, -1: none
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSuffix(line, "\r")
		indent := len(line) - len(strings.TrimLeft(line, " "))
		if blockIndent >= 0 {
			if strings.TrimLeft(line, " \t") == "" || indent > blockIndent {
				continue // the block's text (or a blank line in it)
			}
			blockIndent = -1
		}
		tokenStart := true // the next character may start a token
		for i := 0; i < len(line); i++ {
			c := line[i]
			switch {
			case quote == '\'':
				if c == '\'' {
					if i+1 < len(line) && line[i+1] == '\'' {
						i++
					} else {
						quote = 0
					}
				}
				continue
			case quote == '"':
				if c == '\\' {
					i++
				} else if c == '"' {
					quote = 0
				}
				continue
			case c == '\t':
				return fmt.Errorf("line %d: found character '\\t' that cannot start any token",
					n+1)
			case c == '#' && (i == 0 || line[i-1] == ' '):
				i = len(line) // a comment, to the end of the line
				continue
			case tokenStart && (c == '\'' || c == '"'):
				quote = c
			case tokenStart && (c == '|' || c == '>') &&
				strings.TrimLeft(strings.SplitN(line[i+1:], "#", 2)[0], "+-0123456789 ") == "":
				blockIndent = indent
				i = len(line)
				continue
			}
			tokenStart = strings.IndexByte(" [{,:-?", c) >= 0
		}
	}
	return nil
}
