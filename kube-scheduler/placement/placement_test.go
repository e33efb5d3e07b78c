package placement

// The placement cases of tests/scheduler/placement_cases.yaml (its header says the format),
// run against this port as test_placement_cases.py runs them against the Python placement:
// Fit must answer what each case expects. A key the format does not know fails its case.

import (
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const casesFile = "../../tests/scheduler/placement_cases.yaml"
const now = 1_800_000_000.0 // tests/scheduler/helpers.py NOW

type doc struct {
	Defaults struct {
		Card   map[string]any `yaml:"card"`
		Limits map[string]any `yaml:"limits"`
		Pod    map[string]any `yaml:"pod"`
	} `yaml:"defaults"`
	Cases []map[string]any `yaml:"cases"`
}

var (
	caseKeys      = []string{"name", "why", "limits", "config", "node", "pod", "expect"}
	nodeKeys      = []string{"heartbeat_age_s", "problem", "cards"}
	cardKeys      = []string{"uuid", "index", "model", "memory_mib", "healthy", "booked_mib", "booked_cores", "used_slots"}
	podKeys       = []string{"annotations", "initContainers", "containers"}
	containerKeys = []string{"name", "limits", "restartPolicy"}
	expectKeys    = []string{"placed", "bookings", "shares", "inits", "unfit"}
	unfitKeys     = []string{"is", "says", "unresolvable"}
	// the pod annotations placement reads: a misspelt one would leave its case checking
	// the default
	annotationKeys = []string{"egpu.io/gpu-policy", "egpu.io/memory-oversubscription",
		"egpu.io/use-gpu-type", "egpu.io/nouse-gpu-type", "egpu.io/use-gpu-uuid",
		"egpu.io/nouse-gpu-uuid"}
)

func known(t *testing.T, where string, got map[string]any, allowed []string) {
	t.Helper()
	for k := range got {
		found := false
		for _, a := range allowed {
			found = found || a == k
		}
		if !found {
			t.Fatalf("%s: unknown key %q; allowed: %v", where, k, allowed)
		}
	}
}

func obj(v any) map[string]any {
	if v == nil {
		return map[string]any{}
	}
	return v.(map[string]any)
}

func list(v any) []any {
	if v == nil {
		return nil
	}
	return v.([]any)
}

func num(v any) float64 {
	switch x := v.(type) {
	case int:
		return float64(x)
	case float64:
		return x
	}
	panic(fmt.Sprintf("not a number: %#v", v))
}

func merged(base, over map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

func nodeOf(t *testing.T, d *doc, c map[string]any) NodeState {
	n := obj(c["node"])
	known(t, "node", n, nodeKeys)
	node := NodeState{Name: "n"}
	if s, ok := n["problem"].(string); ok {
		node.Problem = s
	}
	if age, ok := n["heartbeat_age_s"]; !ok || age != "never" {
		hb := now
		if ok {
			hb -= num(age)
		}
		node.Heartbeat = &hb
	}
	for i, raw := range list(n["cards"]) {
		given := obj(raw)
		known(t, fmt.Sprintf("node.cards[%d]", i), given, cardKeys)
		card := merged(d.Defaults.Card, given)
		cs := CardState{UUID: fmt.Sprintf("GPU-%d", i), Index: i, Model: card["model"].(string),
			CapacityMiB: int(num(card["memory_mib"])), Healthy: true}
		if v, ok := card["uuid"]; ok {
			cs.UUID = v.(string)
		}
		if v, ok := card["index"]; ok {
			cs.Index = int(num(v))
		}
		if v, ok := card["healthy"]; ok {
			cs.Healthy = v.(bool)
		}
		if v, ok := card["booked_mib"]; ok {
			cs.BookedMiB = int(num(v))
		}
		if v, ok := card["booked_cores"]; ok {
			cs.BookedCores = int(num(v))
		}
		if v, ok := card["used_slots"]; ok {
			cs.UsedSlots = int(num(v))
		}
		node.Cards = append(node.Cards, cs)
	}
	return node
}

// names is a comma-separated annotation's entries, each non-empty (egpu/requests.py
// _annotation_list).
func names(t *testing.T, key string, v any) []string {
	var out []string
	for _, part := range strings.Split(v.(string), ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			t.Fatalf("%s: %q has an empty entry", key, v)
		}
		out = append(out, part)
	}
	return out
}

func set(t *testing.T, key string, v any) map[string]bool {
	out := map[string]bool{}
	if v != nil {
		for _, n := range names(t, key, v) {
			out[n] = true
		}
	}
	return out
}

// resourceRanges are egpu/requests.py _RANGES: the least and most of each resource (0: none).
var resourceRanges = map[string][2]int{"egpu.io/gpu": {1, 16}, "egpu.io/gpu-memory": {1, 0},
	"egpu.io/gpu-memory-percentage": {1, 100}, "egpu.io/gpu-cores": {1, 100}}

func policyOf(t *testing.T, where string, v any) Policy {
	text, _ := v.(string)
	policy, err := ParsePolicy(text)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return policy
}

// demandOf reads the case's pod as egpu's pod reader does for the names the cases use:
// egpu.io/ resources in limits as whole numbers in their ranges, memory in MiB or as a
// percentage (not both), the filter and policy annotations. A value the reader would refuse
// fails the case. The port's own pod reader (aliases, quantities) is not written yet.
func demandOf(t *testing.T, d *doc, c map[string]any) PodDemand {
	pod := merged(d.Defaults.Pod, obj(c["pod"]))
	known(t, "pod", pod, podKeys)
	var containers []ContainerDemand
	add := func(raw any, kind Kind) {
		ct := obj(raw)
		known(t, "container", ct, containerKeys)
		if kind == Init && ct["restartPolicy"] == "Always" {
			kind = Sidecar
		}
		limits := obj(ct["limits"])
		order := len(containers)
		if len(limits) == 0 {
			return
		}
		values := map[string]int{}
		for k, v := range limits {
			bounds, ok := resourceRanges[k]
			value, whole := v.(int)
			if !ok || !whole || value < bounds[0] || (bounds[1] > 0 && value > bounds[1]) {
				t.Fatalf("container %v: %s=%v; allowed: the egpu.io resources, whole numbers "+
					"in their ranges %v", ct["name"], k, v, resourceRanges)
			}
			values[k] = value
		}
		share := Share{GPUs: 1, Cores: values["egpu.io/gpu-cores"]}
		if n, ok := values["egpu.io/gpu"]; ok {
			share.GPUs = n
		}
		mib, byMiB := values["egpu.io/gpu-memory"]
		pct, byPct := values["egpu.io/gpu-memory-percentage"]
		switch {
		case byMiB && byPct:
			t.Fatalf("container %v: egpu.io/gpu-memory and egpu.io/gpu-memory-percentage "+
				"both given", ct["name"])
		case byMiB:
			share.MemoryMiB, share.HasMemoryMiB = mib, true
		case byPct:
			share.MemoryPercentage = pct
		default:
			share.MemoryPercentage = 100
		}
		containers = append(containers, ContainerDemand{ct["name"].(string), kind, share, order})
	}
	for _, ct := range list(pod["initContainers"]) {
		add(ct, Init)
	}
	for _, ct := range list(pod["containers"]) {
		add(ct, App)
	}
	ann := obj(pod["annotations"])
	known(t, "pod.annotations", ann, annotationKeys)
	cfg := obj(c["config"])
	known(t, "config", cfg, []string{"gpu_policy"})
	policy := Binpack
	if v, ok := cfg["gpu_policy"]; ok {
		policy = policyOf(t, "config.gpu_policy", v)
	}
	if v, ok := ann["egpu.io/gpu-policy"]; ok {
		policy = policyOf(t, "egpu.io/gpu-policy", v)
	}
	oversubscribe := false
	if v, ok := ann["egpu.io/memory-oversubscription"]; ok {
		if v != "true" && v != "false" {
			t.Fatalf("egpu.io/memory-oversubscription: %q; allowed: true, false", v)
		}
		oversubscribe = v == "true"
	}
	demand := PodDemand{Containers: NewPodDemand(containers), GPUPolicy: policy,
		NodePolicy: Binpack, Oversubscribe: oversubscribe,
		UseUUIDs:   set(t, "egpu.io/use-gpu-uuid", ann["egpu.io/use-gpu-uuid"]),
		NouseUUIDs: set(t, "egpu.io/nouse-gpu-uuid", ann["egpu.io/nouse-gpu-uuid"])}
	if v, ok := ann["egpu.io/use-gpu-type"]; ok {
		demand.UseTypes = names(t, "egpu.io/use-gpu-type", v)
	}
	if v, ok := ann["egpu.io/nouse-gpu-type"]; ok {
		demand.NouseTypes = names(t, "egpu.io/nouse-gpu-type", v)
	}
	return demand
}

func limitsOf(t *testing.T, d *doc, c map[string]any) Limits {
	over := obj(c["limits"])
	known(t, "limits", over, []string{"shares_per_card", "memory_ratio", "cores_ratio",
		"heartbeat_timeout_s"})
	l := merged(d.Defaults.Limits, over)
	return Limits{int(num(l["shares_per_card"])), num(l["memory_ratio"]), num(l["cores_ratio"]),
		num(l["heartbeat_timeout_s"])}
}

func ints(v any) []int {
	var out []int
	for _, x := range list(v) {
		out = append(out, int(num(x)))
	}
	return out
}

func checkPlaced(t *testing.T, p *Placement, expect map[string]any) {
	got := map[string][]string{}
	for _, c := range p.Containers {
		for _, s := range c.Cards {
			got[c.Name] = append(got[c.Name], s.UUID)
		}
	}
	want := map[string][]string{}
	for name, uuids := range obj(expect["placed"]) {
		for _, u := range list(uuids) {
			want[name] = append(want[name], u.(string))
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("placed %v, want %v", got, want)
	}
	if shares, ok := expect["shares"]; ok {
		type row struct {
			uuid       string
			mib, cores int
		}
		for name, rows := range obj(shares) {
			var gotRows, wantRows []row
			found := false
			for _, c := range p.Containers {
				if c.Name == name {
					found = true
					for _, s := range c.Cards {
						gotRows = append(gotRows, row{s.UUID, s.MemoryMiB, s.Cores})
					}
				}
			}
			if !found {
				t.Fatalf("shares: no container %q placed", name)
			}
			for _, r := range list(rows) {
				fields := list(r)
				if len(fields) != 3 {
					t.Fatalf("shares of %s: %v; allowed: [UUID, MiB, cores %%]", name, r)
				}
				wantRows = append(wantRows, row{fields[0].(string), int(num(fields[1])),
					int(num(fields[2]))})
			}
			if !reflect.DeepEqual(gotRows, wantRows) {
				t.Fatalf("shares of %s: %v, want %v", name, gotRows, wantRows)
			}
		}
	}
	if inits, ok := expect["inits"]; ok {
		var got, want []string
		for _, c := range p.Containers {
			if c.Init {
				got = append(got, c.Name)
			}
		}
		for _, n := range list(inits) {
			want = append(want, n.(string))
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("inits %v, want %v", got, want)
		}
	}
	if bookings, ok := expect["bookings"]; ok {
		want := map[string]CardBooking{}
		for uuid, amounts := range obj(bookings) {
			a := ints(amounts)
			if len(a) != 3 {
				t.Fatalf("bookings of %s: %v; allowed: [MiB, cores %%, slots]", uuid, amounts)
			}
			want[uuid] = CardBooking{a[0], a[1], a[2]}
		}
		if !reflect.DeepEqual(p.Bookings, want) {
			t.Fatalf("bookings %v, want %v", p.Bookings, want)
		}
	}
}

func checkUnfit(t *testing.T, u *Unfit, expect map[string]any) {
	want := obj(expect["unfit"])
	known(t, "expect.unfit", want, unfitKeys)
	says := list(want["says"])
	if _, ok := want["is"]; !ok && len(says) == 0 {
		t.Fatal("expect.unfit: is, or says (texts)")
	}
	if is, ok := want["is"]; ok && u.Reason != is.(string) {
		t.Fatalf("reason %q, want %q", u.Reason, is)
	}
	for _, text := range says {
		if s, _ := text.(string); s == "" || !strings.Contains(u.Reason, s) {
			t.Fatalf("%q not in %q", text, u.Reason)
		}
	}
	if v, ok := want["unresolvable"]; ok && u.Unresolvable != v.(bool) {
		t.Fatalf("unresolvable %v, want %v (%q)", u.Unresolvable, v, u.Reason)
	}
}

func TestPlacementAnswersEachCaseAsWritten(t *testing.T) {
	text, err := os.ReadFile(casesFile)
	if err != nil {
		t.Fatal(err)
	}
	var d doc
	if err := yaml.Unmarshal(text, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Cases) == 0 {
		t.Fatal("no cases read")
	}
	seen := map[string]bool{}
	for _, c := range d.Cases {
		name := c["name"].(string)
		if seen[name] {
			t.Fatalf("case name twice: %q", name)
		}
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			known(t, "case", c, caseKeys)
			expect := obj(c["expect"])
			known(t, "expect", expect, expectKeys)
			_, placed := expect["placed"]
			_, unfit := expect["unfit"]
			if placed == unfit {
				t.Fatal("expect: placed or unfit, one of them")
			}
			p, u := Fit(nodeOf(t, &d, c), demandOf(t, &d, c), limitsOf(t, &d, c), now)
			if placed {
				if u != nil {
					t.Fatalf("refused, expected placed: %+v", *u)
				}
				checkPlaced(t, p, expect)
				return
			}
			for _, k := range []string{"bookings", "shares", "inits"} {
				if _, ok := expect[k]; ok {
					t.Fatalf("expect: %s goes with placed", k)
				}
			}
			if p != nil {
				t.Fatalf("placed, expected refused: %+v", p.Containers)
			}
			checkUnfit(t, u, expect)
		})
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	t.Logf("%d cases", len(keys))
}
