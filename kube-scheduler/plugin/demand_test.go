package plugin

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	v1 "k8s.io/api/core/v1"

	"github.com/egpu/egpu/kube-scheduler/placement"
)

// TestEachPodReadsAsWritten runs tests/unit/request_cases.yaml (its header says the format)
// against readDemand; tests/unit/test_request_cases.py runs it against egpu.requests.
func TestEachPodReadsAsWritten(t *testing.T) {
	text, err := os.ReadFile("../../tests/unit/request_cases.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []struct {
			Name   string         `yaml:"name"`
			Pod    map[string]any `yaml:"pod"`
			Expect map[string]any `yaml:"expect"`
		} `yaml:"cases"`
	}
	decoder := yaml.NewDecoder(strings.NewReader(string(text)))
	decoder.KnownFields(true)
	if err := decoder.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) == 0 {
		t.Fatal("no cases")
	}
	for _, c := range doc.Cases {
		t.Run(c.Name, func(t *testing.T) {
			raw, err := json.Marshal(c.Pod)
			if err != nil {
				t.Fatal(err)
			}
			var pod v1.Pod
			if err := json.Unmarshal(raw, &pod); err != nil {
				t.Fatalf("the case's pod: %v", err)
			}
			d, err := readDemand(&pod, defaultSettings())
			switch {
			case c.Expect["none"] == true:
				if d != nil || err != nil {
					t.Fatalf("read %+v, %v; want not an egpu pod", d, err)
				}
			case c.Expect["says"] != nil:
				if err == nil || err.Error() != c.Expect["says"] {
					t.Fatalf("refusal\n got %v\nwant %s", err, c.Expect["says"])
				}
			default:
				if err != nil || d == nil {
					t.Fatalf("read %+v, %v; want shares", d, err)
				}
				if got, want := shares(d), c.Expect["shares"]; !reflect.DeepEqual(got, want) {
					t.Fatalf("shares\n got %v\nwant %v", got, want)
				}
			}
		})
	}
}

// shares is the demand as the cases write it: in spec order.
func shares(d *demand) []any {
	ordered := slices.Clone(d.Containers)
	slices.SortFunc(ordered, func(a, b placement.ContainerDemand) int { return a.Order - b.Order })
	out := []any{}
	for _, c := range ordered {
		row := map[string]any{"name": c.Name, "kind": d.kinds[c.Name], "gpus": c.Share.GPUs,
			"cores": c.Share.Cores}
		if c.Share.HasMemoryMiB {
			row["memory_mib"] = c.Share.MemoryMiB
		} else {
			row["memory_percentage"] = c.Share.MemoryPercentage
		}
		out = append(out, row)
	}
	return out
}
