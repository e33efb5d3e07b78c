package plugin

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/egpu/egpu/kube-scheduler/placement"
)

// Args are the plugin's settings (the profile's pluginConfig args), under the names of egpu's
// config (../shared/CONTRACT.md, section "Config"), each defaulting to egpu's default.
type Args struct {
	// SharesPerCard: share slots per card (egpu.io/gpu = cards x this), 1..32 (a card's
	// roster has 32 entries).
	SharesPerCard int `json:"sharesPerCard"`
	// MemoryOversubscriptionRatio: a card books at most this x its memory, 1..100.
	MemoryOversubscriptionRatio float64 `json:"memoryOversubscriptionRatio"`
	// CoresOversubscriptionRatio: a card books at most this x 100% of its compute, 1..100.
	CoresOversubscriptionRatio float64 `json:"coresOversubscriptionRatio"`
	// HeartbeatTimeoutSeconds: a node whose agent has not written its inventory heartbeat
	// for longer takes no share, >= 1 s.
	HeartbeatTimeoutSeconds int `json:"heartbeatTimeoutSeconds"`
	// Priority and ComputePolicy: what the allocation record says for a pod that does not
	// say it (egpu.io/priority: high or low; egpu.io/compute-policy: strict or elastic).
	Priority      string `json:"priority"`
	ComputePolicy string `json:"computePolicy"`
	// GPUPolicy and NodePolicy: the card and node strategies of a pod that does not name
	// them (egpu.io/gpu-policy, egpu.io/node-policy): binpack or spread.
	GPUPolicy  placement.Policy `json:"gpuPolicy"`
	NodePolicy placement.Policy `json:"nodePolicy"`
}

// egpu/config.py's bounds.
const (
	maxSharesPerCard = 32 // egpu.card_roster.NSLOTS
	maxRatio         = 100.0
)

// argNames are Args' JSON names.
var argNames = []string{"sharesPerCard", "memoryOversubscriptionRatio",
	"coresOversubscriptionRatio", "heartbeatTimeoutSeconds", "priority", "computePolicy",
	"gpuPolicy", "nodePolicy"}

// DefaultArgs are egpu's config defaults (egpu/config.py).
func DefaultArgs() Args {
	return Args{SharesPerCard: 10, MemoryOversubscriptionRatio: 1.5,
		CoresOversubscriptionRatio: 1.0, HeartbeatTimeoutSeconds: 120, Priority: "high",
		ComputePolicy: "strict", GPUPolicy: placement.Binpack, NodePolicy: placement.Binpack}
}

// DecodeArgs reads the profile's args for the plugin: nil for the defaults, else the JSON
// the scheduler hands an out-of-tree plugin (runtime.Unknown). A field it does not know, or
// a value out of its range, is an error that names the field, the value and what is allowed.
func DecodeArgs(obj runtime.Object) (Args, error) {
	args := DefaultArgs()
	if obj == nil {
		return args, nil
	}
	unknown, ok := obj.(*runtime.Unknown)
	if !ok {
		return args, fmt.Errorf("%s args: expected JSON, got %T", Name, obj)
	}
	var fields map[string]json.RawMessage // Go's decoder matches names case-insensitively
	if err := json.Unmarshal(unknown.Raw, &fields); err != nil {
		return args, fmt.Errorf("%s args: %v; expected a JSON object", Name, err)
	}
	for key := range fields {
		if !slices.Contains(argNames, key) {
			return args, fmt.Errorf("%s args: unknown field %q; allowed fields: %s", Name, key,
				strings.Join(argNames, ", "))
		}
	}
	if err := json.Unmarshal(unknown.Raw, &args); err != nil {
		return args, fmt.Errorf("%s args: %v", Name, err)
	}
	return args, args.check()
}

func (a Args) check() error {
	bad := func(field string, value any, allowed string) error {
		return fmt.Errorf("%s args: %s=%v is not allowed; allowed: %s", Name, field, value,
			allowed)
	}
	switch {
	case a.SharesPerCard < 1 || a.SharesPerCard > maxSharesPerCard:
		return bad("sharesPerCard", a.SharesPerCard, "an integer 1..32")
	case a.MemoryOversubscriptionRatio < 1 || a.MemoryOversubscriptionRatio > maxRatio:
		return bad("memoryOversubscriptionRatio", a.MemoryOversubscriptionRatio, "1.0..100.0")
	case a.CoresOversubscriptionRatio < 1 || a.CoresOversubscriptionRatio > maxRatio:
		return bad("coresOversubscriptionRatio", a.CoresOversubscriptionRatio, "1.0..100.0")
	case a.HeartbeatTimeoutSeconds < 1:
		return bad("heartbeatTimeoutSeconds", a.HeartbeatTimeoutSeconds, "an integer >= 1")
	case a.Priority != "high" && a.Priority != "low":
		return bad("priority", a.Priority, "high, low")
	case a.ComputePolicy != "strict" && a.ComputePolicy != "elastic":
		return bad("computePolicy", a.ComputePolicy, "strict, elastic")
	}
	if _, err := placement.ParsePolicy(string(a.GPUPolicy)); err != nil {
		return bad("gpuPolicy", a.GPUPolicy, "binpack, spread")
	}
	if _, err := placement.ParsePolicy(string(a.NodePolicy)); err != nil {
		return bad("nodePolicy", a.NodePolicy, "binpack, spread")
	}
	return nil
}

// limits are the placement's bounds.
func (a Args) limits() placement.Limits {
	return placement.Limits{SharesPerCard: a.SharesPerCard,
		MemoryRatio: a.MemoryOversubscriptionRatio, CoresRatio: a.CoresOversubscriptionRatio,
		HeartbeatTimeoutS: float64(a.HeartbeatTimeoutSeconds)}
}
