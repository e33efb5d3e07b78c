package records

// The record cases of tests/unit/record_cases.yaml (its header says the format), run against
// this port as test_record_cases.py runs them against egpu.records.

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const casesFile = "../../tests/unit/record_cases.yaml"

func allocationFields(a Allocation) map[string]any {
	str := func(p *string) any {
		if p == nil {
			return nil
		}
		return *p
	}
	var over any
	if a.MemoryOversubscription != nil {
		over = *a.MemoryOversubscription
	}
	containers := []any{}
	for _, c := range a.Containers {
		cards := []any{}
		for _, s := range c.Cards {
			cards = append(cards, []any{s.UUID, int(s.Index), int(s.MemoryMiB), int(s.Cores)})
		}
		var kind, share any
		if c.Kind != "" {
			kind = c.Kind
		}
		if c.Share != "" {
			share = c.Share
		}
		containers = append(containers, map[string]any{"name": c.Name, "kind": kind,
			"init": c.Init, "share": share, "cards": cards})
	}
	return map[string]any{"node": a.Node, "priority": str(a.Priority),
		"compute_policy": str(a.ComputePolicy), "memory_oversubscription": over,
		"containers": containers}
}

func inventoryFields(inv Inventory) map[string]any {
	cards := []any{}
	for _, c := range inv.Cards {
		cards = append(cards, map[string]any{"uuid": c.UUID, "index": int(c.Index),
			"model": c.Model, "memory_mib": int(c.MemoryMiB), "healthy": c.Healthy,
			"numa_node": int(c.NUMANode), "driver_memory_limit": c.DriverMemoryLimit})
	}
	return map[string]any{"cards": cards}
}

// normalized is the YAML value with the empty lists YAML leaves nil made empty, as the
// fields above build them.
func normalized(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, val := range x {
			out[k] = normalized(val)
		}
		return out
	case []any:
		out := []any{}
		for _, val := range x {
			out = append(out, normalized(val))
		}
		return out
	}
	return v
}

func TestEachRecordReadsAsWritten(t *testing.T) {
	text, err := os.ReadFile(casesFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []struct {
			Name   string         `yaml:"name"`
			Record string         `yaml:"record"`
			Text   string         `yaml:"text"`
			Expect map[string]any `yaml:"expect"`
		} `yaml:"cases"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(text)))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) == 0 {
		t.Fatal("no cases read")
	}
	for _, c := range doc.Cases {
		t.Run(c.Name, func(t *testing.T) {
			for k := range c.Expect {
				if k != "decoded" && k != "encoded" && k != "error" {
					t.Fatalf("expect: unknown key %q", k)
				}
			}
			var fields map[string]any
			var encoded string
			var err error
			switch c.Record {
			case "allocation":
				var a Allocation
				if a, err = DecodeAllocation(c.Text); err == nil {
					fields = allocationFields(a)
					if encoded, err = a.Encode(); err != nil {
						t.Fatal(err)
					}
				}
			case "inventory":
				var inv Inventory
				if inv, err = DecodeInventory(c.Text); err == nil {
					fields = inventoryFields(inv)
				}
			default:
				t.Fatalf("record: %q; allowed: allocation, inventory", c.Record)
			}
			if want, ok := c.Expect["error"]; ok {
				texts, _ := want.([]any)
				if len(texts) == 0 {
					t.Fatal("error: a non-empty list of texts")
				}
				if err == nil {
					t.Fatalf("read %v, expected refused", fields)
				}
				for _, w := range texts {
					if s, _ := w.(string); s == "" || !strings.Contains(err.Error(), s) {
						t.Fatalf("%q not in %q", w, err.Error())
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if want := normalized(c.Expect["decoded"]); !reflect.DeepEqual(fields, want) {
				t.Fatalf("decoded %v,\nwant %v", fields, want)
			}
			want, ok := c.Expect["encoded"]
			if c.Record == "allocation" && (!ok || encoded != want) {
				t.Fatalf("encoded %s,\nwant %v", encoded, want)
			}
		})
	}
}
