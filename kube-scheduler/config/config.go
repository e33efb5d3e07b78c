// Package config reads egpu's configuration file (the ConfigMap egpu-config,
// ../shared/CONTRACT.md section "Config") as egpu/config.py does: the same keys, defaults and
// bounds, the same files refused with the same words, and the last good config kept for a
// restart on a bad one. egpu-kube-scheduler reads the file the webhook and the node agents
// read, so that a cluster admin writes each setting once. tests/unit/config_cases.yaml runs
// against both readers.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Defaults are the policies of a pod that does not say them.
type Defaults struct {
	Priority      string `json:"priority"`      // high | low
	ComputePolicy string `json:"computePolicy"` // strict | elastic
	GPUPolicy     string `json:"gpuPolicy"`     // binpack | spread: the card on the node
	NodePolicy    string `json:"nodePolicy"`    // binpack | spread: which node
}

// Config is the parsed file; the keys are egpu/config.py's (its docstring says what each
// means).
type Config struct {
	SchedulerName               string            `json:"schedulerName"`
	ResourceAliases             map[string]string `json:"resourceAliases"`
	Defaults                    Defaults          `json:"defaults"`
	PriorityClasses             map[string]string `json:"priorityClasses"`
	SharesPerCard               int               `json:"sharesPerCard"`
	MemoryOversubscriptionRatio float64           `json:"memoryOversubscriptionRatio"`
	CoresOversubscriptionRatio  float64           `json:"coresOversubscriptionRatio"`
	IgnoredNamespaces           []string          `json:"ignoredNamespaces"`
	AllowPrivileged             bool              `json:"allowPrivileged"`
	HeartbeatTimeoutSeconds     int               `json:"heartbeatTimeoutSeconds"`
	LowPriorityFloorPercent     int               `json:"lowPriorityFloorPercent"`
	AllocationMode              string            `json:"allocationMode"`
	NamespaceAllocationModes    map[string]string `json:"namespaceAllocationModes"`
}

// The contract's names (egpu/contract.py) and bounds (egpu/config.py).
var (
	egpuResources = []string{"egpu.io/gpu", "egpu.io/gpu-memory",
		"egpu.io/gpu-memory-percentage", "egpu.io/gpu-cores"}
	priorities      = []string{"high", "low"}
	computePolicies = []string{"strict", "elastic"}
	policies        = []string{"binpack", "spread"}
	allocationModes = []string{"extender", "dra"}
)

const (
	nativeNvidiaGPU    = "nvidia.com/gpu" // whole cards, left to NVIDIA's device plugin
	maxSharesPerCard   = 32               // a card roster's entries (egpu.card_roster.NSLOTS)
	minRatio, maxRatio = 1.0, 100.0
	maxFloorPercent    = 100
	// a node silent for longer than a day is no node to place on
	maxHeartbeatTimeoutS = 86400
)

// Default is the configuration of an absent or empty file.
func Default() Config {
	return Config{
		SchedulerName: "egpu-scheduler",
		ResourceAliases: map[string]string{
			"volcano.sh/vgpu-number":            "egpu.io/gpu",
			"volcano.sh/vgpu-memory":            "egpu.io/gpu-memory",
			"volcano.sh/vgpu-memory-percentage": "egpu.io/gpu-memory-percentage",
			"volcano.sh/vgpu-cores":             "egpu.io/gpu-cores",
		},
		Defaults:                    Defaults{"high", "strict", "binpack", "binpack"},
		PriorityClasses:             map[string]string{},
		SharesPerCard:               10,
		MemoryOversubscriptionRatio: 1.5,
		CoresOversubscriptionRatio:  1.0,
		IgnoredNamespaces:           []string{"kube-system", "egpu-system"},
		HeartbeatTimeoutSeconds:     120,
		AllocationMode:              "extender",
		NamespaceAllocationModes:    map[string]string{},
	}
}

// Error is a refused config; its text names the key (a dotted path), the value and what is
// allowed, in egpu/config.py's words.
type Error struct{ Text string }

func (e *Error) Error() string { return e.Text }

func refuse(format string, args ...any) error {
	return &Error{fmt.Sprintf(format, args...)}
}

// Parse reads the text of a config file: empty text gives Default. *Error for text that is
// not one YAML document, an unknown key or a bad value (the first one egpu/config.py finds).
func Parse(text string) (Config, error) {
	if text == "" {
		return Default(), nil
	}
	data, err := decodeYAML(text)
	if err != nil {
		return Config{}, refuse("config: not valid YAML (%v)", err)
	}
	return parse(data)
}

func parse(data any) (Config, error) {
	c := Default()
	if data == nil {
		return c, nil
	}
	doc, err := asMapping(data, "config")
	if err != nil {
		return c, err
	}
	type field struct {
		key  string
		read func(v any, key string) error
	}
	fields := []field{
		{"schedulerName", func(v any, k string) (err error) {
			c.SchedulerName, err = name(v, k)
			return err
		}},
		{"resourceAliases", func(v any, _ string) (err error) {
			c.ResourceAliases, err = aliases(v)
			return err
		}},
		{"defaults", func(v any, _ string) (err error) {
			c.Defaults, err = defaults(v)
			return err
		}},
		{"priorityClasses", func(v any, _ string) (err error) {
			c.PriorityClasses, err = priorityClasses(v)
			return err
		}},
		{"sharesPerCard", func(v any, k string) (err error) {
			c.SharesPerCard, err = boundedInt(v, k, 1, maxSharesPerCard)
			return err
		}},
		{"memoryOversubscriptionRatio", func(v any, k string) (err error) {
			c.MemoryOversubscriptionRatio, err = ratio(v, k)
			return err
		}},
		{"coresOversubscriptionRatio", func(v any, k string) (err error) {
			c.CoresOversubscriptionRatio, err = ratio(v, k)
			return err
		}},
		{"ignoredNamespaces", func(v any, k string) (err error) {
			c.IgnoredNamespaces, err = names(v, k)
			return err
		}},
		{"allowPrivileged", func(v any, k string) error {
			b, ok := v.(bool)
			if !ok {
				return refuse("%s: %s is not allowed; allowed: true, false", k, repr(v))
			}
			c.AllowPrivileged = b
			return nil
		}},
		{"heartbeatTimeoutSeconds", func(v any, k string) (err error) {
			c.HeartbeatTimeoutSeconds, err = boundedInt(v, k, 1, maxHeartbeatTimeoutS)
			return err
		}},
		{"lowPriorityFloorPercent", func(v any, k string) (err error) {
			c.LowPriorityFloorPercent, err = boundedInt(v, k, 0, maxFloorPercent)
			return err
		}},
		{"allocationMode", func(v any, k string) (err error) {
			c.AllocationMode, err = choice(v, k, allocationModes)
			return err
		}},
		{"namespaceAllocationModes", func(v any, _ string) (err error) {
			c.NamespaceAllocationModes, err = namespaceModes(v)
			return err
		}},
	}
	known := make([]string, len(fields))
	for i, f := range fields {
		known[i] = f.key
	}
	if err := checkUnknown(doc, known, ""); err != nil {
		return c, err
	}
	for _, f := range fields {
		if v, ok := doc.get(f.key); ok {
			if err := f.read(v, f.key); err != nil {
				return c, err
			}
		}
	}
	return c, nil
}

func asMapping(v any, key string) (mapping, error) {
	m, ok := v.(mapping)
	if !ok {
		return nil, refuse("%s: expected a mapping, got %s", key, repr(v))
	}
	return m, nil
}

func checkUnknown(m mapping, known []string, prefix string) error {
	for _, p := range m {
		if k, ok := p.key.(string); !ok || !slices.Contains(known, k) {
			sorted := slices.Clone(known)
			slices.Sort(sorted)
			return refuse("%s%s: unknown key; allowed: %s", prefix, str(p.key),
				strings.Join(sorted, ", "))
		}
	}
	return nil
}

func choice(v any, key string, allowed []string) (string, error) {
	if s, ok := v.(string); ok && slices.Contains(allowed, s) {
		return s, nil
	}
	return "", refuse("%s: %s is not allowed; allowed: %s", key, repr(v),
		strings.Join(allowed, ", "))
}

func name(v any, key string) (string, error) {
	if s, ok := v.(string); ok && s != "" {
		return s, nil
	}
	return "", refuse("%s: %s must be a non-empty string", key, repr(v))
}

func names(v any, key string) ([]string, error) {
	items, ok := v.([]any)
	out := make([]string, 0, len(items))
	for _, item := range items {
		s, isText := item.(string)
		if !isText || s == "" {
			ok = false
			break
		}
		out = append(out, s)
	}
	if !ok {
		return nil, refuse("%s: %s must be a list of non-empty strings", key, repr(v))
	}
	return out, nil
}

// numericText is egpu/config.py's _numeric_text: a number written as text (what `helm --set`
// leaves of a float, or a quoted YAML value) read as one, by Python's int() or float().
func numericText(v any, asFloat bool) any {
	s, ok := v.(string)
	if !ok {
		return v
	}
	t := strings.TrimSpace(s)
	if !pythonNumber(t, asFloat) {
		return v
	}
	t = strings.ReplaceAll(t, "_", "")
	if asFloat {
		f, err := strconv.ParseFloat(t, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return v
		}
		return f
	}
	n, ok := new(big.Int).SetString(t, 10)
	if !ok {
		return v
	}
	return n
}

// pythonNumber: whether Python's int() (base 10) or float() reads the text: digits with
// single underscores between them, a sign, and for float() a point, an exponent, inf or nan
// (no hexadecimal, which Go's ParseFloat would read).
func pythonNumber(t string, asFloat bool) bool {
	body := strings.TrimLeft(t, "+-")
	if len(t)-len(body) > 1 {
		return false
	}
	if asFloat {
		switch strings.ToLower(body) {
		case "inf", "infinity", "nan":
			return true
		}
	}
	digits := func(s string) bool { // digits, single underscores between them
		if s == "" || s[0] == '_' || s[len(s)-1] == '_' || strings.Contains(s, "__") {
			return false
		}
		return strings.Trim(s, "0123456789_") == ""
	}
	if !asFloat {
		return digits(body)
	}
	mantissa, exponent, hasExp := strings.Cut(strings.ToLower(body), "e")
	if hasExp && !digits(strings.TrimLeft(exponent, "+-")) ||
		hasExp && len(exponent)-len(strings.TrimLeft(exponent, "+-")) > 1 {
		return false
	}
	whole, frac, hasPoint := strings.Cut(mantissa, ".")
	switch {
	case !hasPoint:
		return digits(whole)
	case whole == "":
		return digits(frac)
	case frac == "":
		return digits(whole)
	}
	return digits(whole) && digits(frac)
}

// boundedInt is egpu/config.py's _int: a whole number (not a boolean) within low..high (every
// integer key has both bounds).
func boundedInt(v any, key string, low, high int64) (int, error) {
	v = numericText(v, false)
	n, ok := v.(*big.Int)
	if !ok {
		return 0, refuse("%s: %s is not an integer", key, repr(v))
	}
	if n.Cmp(big.NewInt(low)) < 0 || n.Cmp(big.NewInt(high)) > 0 {
		return 0, refuse("%s: %s is out of range; allowed: %d..%d", key, n.String(), low, high)
	}
	return int(n.Int64()), nil
}

// ratio is egpu/config.py's _ratio: a number (not a boolean) within 1.0..100.0.
func ratio(v any, key string) (float64, error) {
	v = numericText(v, true)
	var f float64
	switch x := v.(type) {
	case float64:
		f = x
	case *big.Int:
		f, _ = new(big.Float).SetInt(x).Float64()
	default:
		return 0, refuse("%s: %s is not a number", key, repr(v))
	}
	if !(f >= minRatio && f <= maxRatio) {
		return 0, refuse("%s: %s is out of range; allowed: 1.0..100.0", key, str(v))
	}
	return f, nil
}

func defaults(v any) (Defaults, error) {
	d := Default().Defaults
	m, err := asMapping(v, "defaults")
	if err != nil {
		return d, err
	}
	if err := checkUnknown(m, []string{"priority", "computePolicy", "gpuPolicy",
		"nodePolicy"}, "defaults."); err != nil {
		return d, err
	}
	for _, f := range []struct {
		key     string
		allowed []string
		into    *string
	}{{"priority", priorities, &d.Priority}, {"computePolicy", computePolicies, &d.ComputePolicy},
		{"gpuPolicy", policies, &d.GPUPolicy}, {"nodePolicy", policies, &d.NodePolicy}} {
		if value, ok := m.get(f.key); ok {
			if *f.into, err = choice(value, "defaults."+f.key, f.allowed); err != nil {
				return d, err
			}
		}
	}
	return d, nil
}

func aliases(v any) (map[string]string, error) {
	m, err := asMapping(v, "resourceAliases")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range m {
		alias, ok := p.key.(string)
		switch {
		case !ok || !strings.Contains(alias, "/"):
			return nil, refuse("resourceAliases: key %s is not a resource name (domain/name)",
				repr(p.key))
		case slices.Contains(egpuResources, alias):
			return nil, refuse("resourceAliases.%s: an egpu.io name cannot be an alias", alias)
		case alias == nativeNvidiaGPU:
			return nil, refuse("resourceAliases.%s: %s cannot be an alias (whole cards are left "+
				"to NVIDIA's device plugin); allowed: another resource name (domain/name)",
				alias, alias)
		}
		if out[alias], err = choice(p.value, "resourceAliases."+alias, egpuResources); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func priorityClasses(v any) (map[string]string, error) {
	m, err := asMapping(v, "priorityClasses")
	if err != nil {
		return nil, err
	}
	for _, p := range m {
		if s, ok := p.key.(string); !ok || s == "" {
			return nil, refuse("priorityClasses: key %s is not allowed; allowed: a "+
				"PriorityClass name (text)", repr(p.key))
		}
	}
	out := map[string]string{}
	for _, p := range m {
		k := p.key.(string)
		if out[k], err = choice(p.value, "priorityClasses."+k, priorities); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func namespaceModes(v any) (map[string]string, error) {
	m, err := asMapping(v, "namespaceAllocationModes")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range m {
		ns, ok := p.key.(string)
		if !ok || ns == "" {
			return nil, refuse("namespaceAllocationModes: key %s is not a namespace name",
				repr(p.key))
		}
		if out[ns], err = choice(p.value, "namespaceAllocationModes."+ns,
			allocationModes); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// LastGoodFile is where LoadKeeping keeps the last good config, in its keep folder.
const LastGoodFile = "config.last-good.yaml"

// Loaded is the config a part runs: Source "file" (the file as it is, or Default when the
// part has no file) or "last-good" (the file is bad: Err says why, and Config is the last one
// this part loaded well); Generation: the first 12 hex digits of the SHA-256 of the text it
// came from, "defaults" without one (the egpu_config_info metric's label).
type Loaded struct {
	Config     Config
	Source     string
	Generation string
	Err        string
}

// Generation is a config text's generation (egpu/config.py config_generation).
func Generation(text string) string {
	sum := sha256.Sum256([]byte(text))
	return hex.EncodeToString(sum[:])[:12]
}

// LoadKeeping is egpu/config.py's load_config_keeping: the file at path ("" for none:
// Default). A good file is also written to keepDir/LastGoodFile (atomically; keepDir "":
// nothing kept). A bad or unreadable file falls back to that kept copy, with Err saying
// why; with no kept copy the error is returned (*Error, or the file's I/O error): a part that
// never had a good config does not guess one.
func LoadKeeping(path, keepDir string) (Loaded, error) {
	if path == "" {
		return Loaded{Config: Default(), Source: "file", Generation: "defaults"}, nil
	}
	raw, err := os.ReadFile(path)
	var config Config
	if err == nil {
		config, err = Parse(string(raw))
	}
	if err != nil {
		kept := ""
		if keepDir != "" {
			kept = filepath.Join(keepDir, LastGoodFile)
		}
		keptText, readErr := os.ReadFile(kept)
		if kept == "" || readErr != nil {
			return Loaded{}, err
		}
		good, parseErr := Parse(string(keptText))
		if parseErr != nil {
			return Loaded{}, parseErr
		}
		return Loaded{Config: good, Source: "last-good", Generation: Generation(string(keptText)),
			Err: fmt.Sprintf("%s: %v", path, err)}, nil
	}
	if keepDir != "" {
		keep(keepDir, raw) // nothing kept this time: the part runs on the good file all the same
	}
	return Loaded{Config: config, Source: "file", Generation: Generation(string(raw))}, nil
}

func keep(dir string, text []byte) {
	if os.MkdirAll(dir, 0o755) != nil {
		return
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d", LastGoodFile, os.Getpid()))
	if os.WriteFile(tmp, text, 0o644) != nil {
		return
	}
	if os.Rename(tmp, filepath.Join(dir, LastGoodFile)) != nil {
		_ = os.Remove(tmp)
	}
}
