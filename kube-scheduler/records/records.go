// Package records reads and writes the versioned JSON records the plugin exchanges with
// egpu's other parts through the Kubernetes API (egpu/records.py, egpu/node_records.py): the
// pod annotation egpu.io/allocation (written at bind, read back as bookings) and the node
// annotation egpu.io/inventory (the node agent's cards). Decoding is as strict as Python's:
// an error names the field, the value and what is allowed. Units: MiB, % of one card.
//
// tests/unit/record_cases.yaml is the yardstick both implementations answer to
// (records_test.go here, tests/unit/test_record_cases.py there).
package records

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/egpu/egpu/kube-scheduler/pyrepr"
)

// Version is the "version" of every record (egpu.contract.RECORD_VERSION).
const Version = 1

// MaxCardMiB is the largest card memory an inventory may state (egpu.contract.MAX_SHARE_MIB).
const MaxCardMiB = int64(1) << 40

// Container kinds in an allocation (egpu.records KIND_*).
const (
	KindApp     = "container"
	KindInit    = "init"
	KindSidecar = "sidecar"
)

var (
	priorities      = []string{"high", "low"}
	computePolicies = []string{"strict", "elastic"}
	kinds           = []string{KindApp, KindInit, KindSidecar}
	integer         = regexp.MustCompile(`^-?[0-9]+$`)
)

// Error is a malformed record; its text names the field and the value.
type Error struct{ Text string }

func (e *Error) Error() string { return e.Text }

func fail(format string, args ...any) *Error { return &Error{fmt.Sprintf(format, args...)} }

// CardShare is what one container holds of one card.
type CardShare struct {
	UUID      string `json:"uuid"`
	Index     int64  `json:"index"`
	MemoryMiB int64  `json:"memory_mib"`
	Cores     int64  `json:"cores"`
}

// ContainerAllocation is the cards given to one container. Kind is "" in a record of an
// older extender; Share names the accounting region it draws on when not its own ("": own).
type ContainerAllocation struct {
	Name  string      `json:"name"`
	Kind  string      `json:"kind,omitempty"`
	Init  bool        `json:"init"`
	Cards []CardShare `json:"cards"`
	Share string      `json:"share,omitempty"`
}

// Allocation is the pod annotation egpu.io/allocation. Priority, ComputePolicy and
// MemoryOversubscription are nil in a record of an older extender.
type Allocation struct {
	Version                int                   `json:"version"`
	Node                   string                `json:"node"`
	Priority               *string               `json:"priority,omitempty"`
	ComputePolicy          *string               `json:"compute_policy,omitempty"`
	MemoryOversubscription *bool                 `json:"memory_oversubscription,omitempty"`
	Containers             []ContainerAllocation `json:"containers"`
}

// Card is one GPU of a node's inventory.
type Card struct {
	UUID              string `json:"uuid"`
	Index             int64  `json:"index"`
	Model             string `json:"model"`
	MemoryMiB         int64  `json:"memory_mib"`
	Healthy           bool   `json:"healthy"`
	NUMANode          int64  `json:"numa_node"`
	DriverMemoryLimit bool   `json:"driver_memory_limit"`
}

// Inventory is the node annotation egpu.io/inventory.
type Inventory struct {
	Cards []Card
}

// Encode is the annotation's text, byte for byte as egpu.records.Allocation.encode writes it
// (compact JSON, fields in its order, the policies and kinds only where known).
func (a Allocation) Encode() (string, error) {
	a.Version = Version
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(a); err != nil {
		return "", err
	}
	return strings.TrimSuffix(out.String(), "\n"), nil
}

// repr is a JSON value as Python's repr shows it in egpu's messages: 'text', True, None, 3.
func repr(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case string:
		return pyrepr.String(x)
	case json.Number:
		return x.String()
	case []any:
		return "[...]"
	case map[string]any:
		return "{...}"
	}
	return fmt.Sprint(v)
}

func load(text, what string) (map[string]any, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var data any
	if err := dec.Decode(&data); err != nil {
		return nil, fail("%s: not valid JSON (%v)", what, err)
	}
	if dec.More() {
		return nil, fail("%s: not valid JSON (extra data after the object)", what)
	}
	obj, ok := data.(map[string]any)
	if !ok {
		return nil, fail("%s: expected a JSON object, got %s", what, typeName(data))
	}
	if v, ok := obj["version"].(json.Number); !ok || v.String() != strconv.Itoa(Version) {
		return nil, fail("%s.version: %s is not supported; allowed: %d", what,
			repr(obj["version"]), Version)
	}
	return obj, nil
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case string:
		return "str"
	case json.Number:
		if integer.MatchString(v.(json.Number).String()) {
			return "int"
		}
		return "float"
	case []any:
		return "list"
	}
	return "dict"
}

func field(obj map[string]any, key, where string) (any, error) {
	v, ok := obj[key]
	if !ok {
		return nil, fail("%s.%s: missing", where, key)
	}
	return v, nil
}

func intField(obj map[string]any, key, where string) (int64, error) {
	v, err := field(obj, key, where)
	if err != nil {
		return 0, err
	}
	n, ok := v.(json.Number)
	if !ok || !integer.MatchString(n.String()) {
		return 0, fail("%s.%s: %s is not an integer", where, key, repr(v))
	}
	i, perr := strconv.ParseInt(n.String(), 10, 64)
	if perr != nil {
		return 0, fail("%s.%s: %s out of range", where, key, n.String())
	}
	return i, nil
}

func strField(obj map[string]any, key, where string) (string, error) {
	v, err := field(obj, key, where)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fail("%s.%s: %s is not a str", where, key, repr(v))
	}
	return s, nil
}

func boolField(obj map[string]any, key, where string) (bool, error) {
	v, err := field(obj, key, where)
	if err != nil {
		return false, err
	}
	b, ok := v.(bool)
	if !ok {
		return false, fail("%s.%s: %s is not a bool", where, key, repr(v))
	}
	return b, nil
}

func listField(obj map[string]any, key, where string) ([]any, error) {
	v, err := field(obj, key, where)
	if err != nil {
		return nil, err
	}
	l, ok := v.([]any)
	if !ok {
		return nil, fail("%s.%s: %s is not a list", where, key, repr(v))
	}
	return l, nil
}

// choice is the optional string key of obj, one of allowed; nil when absent.
func choice(obj map[string]any, key string, allowed []string, where string) (*string, error) {
	if _, ok := obj[key]; !ok {
		return nil, nil
	}
	s, err := strField(obj, key, where)
	if err != nil {
		return nil, err
	}
	for _, a := range allowed {
		if s == a {
			return &s, nil
		}
	}
	return nil, fail("%s.%s: %s; allowed: %s", where, key, repr(s), strings.Join(allowed, ", "))
}

func object(v any, where string) (map[string]any, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fail("%s: expected an object, got %s", where, repr(v))
	}
	return obj, nil
}

func nonNegative(obj map[string]any, key, where string) (int64, error) {
	v, err := intField(obj, key, where)
	if err == nil && v < 0 {
		err = fail("%s.%s: %d is negative; allowed: >= 0", where, key, v)
	}
	return v, err
}

func cardShare(v any, where string) (CardShare, error) {
	obj, err := object(v, where)
	if err != nil {
		return CardShare{}, err
	}
	cores, err := intField(obj, "cores", where)
	if err != nil {
		return CardShare{}, err
	}
	if cores < 0 || cores > 100 {
		return CardShare{}, fail("%s.cores: %d out of range; allowed: 0..100", where, cores)
	}
	mib, err := intField(obj, "memory_mib", where)
	if err != nil {
		return CardShare{}, err
	}
	if mib <= 0 {
		return CardShare{}, fail("%s.memory_mib: %d must be >= 1", where, mib)
	}
	uuid, err := strField(obj, "uuid", where)
	if err != nil {
		return CardShare{}, err
	}
	index, err := nonNegative(obj, "index", where)
	return CardShare{uuid, index, mib, cores}, err
}

// isFileName: one path component that names no other folder (egpu.contract.is_file_name).
func isFileName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "/\x00") && name != "." && name != ".."
}

func containerAllocation(v any, where string) (ContainerAllocation, error) {
	var c ContainerAllocation
	obj, err := object(v, where)
	if err != nil {
		return c, err
	}
	raw, err := listField(obj, "cards", where)
	if err != nil {
		return c, err
	}
	seen := map[string]bool{}
	for j, s := range raw {
		share, err := cardShare(s, fmt.Sprintf("%s.cards[%d]", where, j))
		if err != nil {
			return c, err
		}
		c.Cards = append(c.Cards, share)
		seen[share.UUID] = true
	}
	if len(c.Cards) == 0 {
		return c, fail("%s.cards: empty; a container with a share has >= 1 card", where)
	}
	if len(seen) != len(c.Cards) {
		return c, fail("%s.cards: a card appears twice; cards must be distinct", where)
	}
	if c.Name, err = strField(obj, "name", where); err != nil {
		return c, err
	}
	if c.Init, err = boolField(obj, "init", where); err != nil {
		return c, err
	}
	kind, err := choice(obj, "kind", kinds, where)
	if err != nil {
		return c, err
	}
	if kind != nil {
		c.Kind = *kind
		if c.Init != (c.Kind != KindApp) {
			return c, fail("%s.init: %s does not match kind %s (an init container or sidecar "+
				"has init true, an app container false)", where, repr(c.Init), repr(c.Kind))
		}
	}
	if share, ok := obj["share"]; ok && share != nil {
		s, isStr := share.(string)
		if !isStr || !isFileName(s) {
			return c, fail("%s.share: %s; allowed: a folder name (no '/', not '.' or '..', "+
				"not empty)", where, repr(share))
		}
		c.Share = s
	}
	return c, nil
}

// DecodeAllocation parses an egpu.io/allocation annotation.
func DecodeAllocation(text string) (Allocation, error) {
	const where = "allocation"
	a := Allocation{Version: Version}
	data, err := load(text, where)
	if err != nil {
		return a, err
	}
	raw, err := listField(data, "containers", where)
	if err != nil {
		return a, err
	}
	for i, c := range raw {
		ca, err := containerAllocation(c, fmt.Sprintf("%s.containers[%d]", where, i))
		if err != nil {
			return a, err
		}
		a.Containers = append(a.Containers, ca)
	}
	if node, ok := data["node"]; ok {
		s, isStr := node.(string)
		if !isStr {
			return a, fail("%s.node: %s is not a string", where, repr(node))
		}
		a.Node = s
	}
	if _, ok := data["memory_oversubscription"]; ok {
		b, err := boolField(data, "memory_oversubscription", where)
		if err != nil {
			return a, err
		}
		a.MemoryOversubscription = &b
	}
	if a.Priority, err = choice(data, "priority", priorities, where); err != nil {
		return a, err
	}
	a.ComputePolicy, err = choice(data, "compute_policy", computePolicies, where)
	return a, err
}

// DecodeInventory parses an egpu.io/inventory annotation; a UUID twice is an error.
func DecodeInventory(text string) (Inventory, error) {
	var inv Inventory
	data, err := load(text, "inventory")
	if err != nil {
		return inv, err
	}
	raw, err := listField(data, "cards", "inventory")
	if err != nil {
		return inv, err
	}
	for i, v := range raw {
		card, err := decodeCard(v, fmt.Sprintf("inventory.cards[%d]", i))
		if err != nil {
			return inv, err
		}
		inv.Cards = append(inv.Cards, card)
	}
	seen := map[string]bool{}
	for _, c := range inv.Cards {
		if seen[c.UUID] {
			return inv, fail("inventory.cards: uuid %s appears twice", repr(c.UUID))
		}
		seen[c.UUID] = true
	}
	return inv, nil
}

func decodeCard(v any, where string) (Card, error) {
	card := Card{Healthy: true, NUMANode: -1}
	obj, err := object(v, where)
	if err != nil {
		return card, err
	}
	if card.UUID, err = strField(obj, "uuid", where); err != nil {
		return card, err
	}
	if card.UUID == "" {
		return card, fail("%s.uuid: empty", where)
	}
	if card.MemoryMiB, err = intField(obj, "memory_mib", where); err != nil {
		return card, err
	}
	if card.MemoryMiB <= 0 {
		return card, fail("%s.memory_mib: %d must be >= 1", where, card.MemoryMiB)
	}
	if card.MemoryMiB > MaxCardMiB {
		return card, fail("%s.memory_mib: %d out of range; allowed: 1..%d", where,
			card.MemoryMiB, MaxCardMiB)
	}
	if card.Index, err = nonNegative(obj, "index", where); err != nil {
		return card, err
	}
	if card.Model, err = strField(obj, "model", where); err != nil {
		return card, err
	}
	if _, ok := obj["healthy"]; ok {
		if card.Healthy, err = boolField(obj, "healthy", where); err != nil {
			return card, err
		}
	}
	if _, ok := obj["numa_node"]; ok {
		if card.NUMANode, err = intField(obj, "numa_node", where); err != nil {
			return card, err
		}
	}
	if _, ok := obj["driver_memory_limit"]; ok {
		card.DriverMemoryLimit, err = boolField(obj, "driver_memory_limit", where)
	}
	return card, err
}
