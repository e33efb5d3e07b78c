package plugin

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	"github.com/egpu/egpu/kube-scheduler/config"
	"github.com/egpu/egpu/kube-scheduler/placement"
)

// Args are the plugin's settings (the profile's pluginConfig args): where egpu's config file
// is, the file the webhook and the node agents read (the ConfigMap egpu-config), so that a
// cluster admin writes each setting once. The plugin takes its limits and defaults from it.
type Args struct {
	// ConfigFile: egpu's config file; "" for its defaults (egpu/config.py).
	ConfigFile string `json:"configFile"`
	// ConfigKeepDir: where the last good config is kept, so that a restart on a bad file
	// runs on it (config.LoadKeeping); "" keeps none.
	ConfigKeepDir string `json:"configKeepDir"`
}

// argNames are Args' JSON names.
var argNames = []string{"configFile", "configKeepDir"}

// DecodeArgs reads the profile's args for the plugin: nil for none, else the JSON the
// scheduler hands an out-of-tree plugin (runtime.Unknown). A field it does not know is an
// error that names it and the allowed ones.
func DecodeArgs(obj runtime.Object) (Args, error) {
	var args Args
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
	return args, nil
}

// settings are what the plugin takes from egpu's config: the placement's bounds, the policies
// of a pod that does not say them, and the priority of a PriorityClass (for a pod the webhook
// did not label).
type settings struct {
	limits          placement.Limits
	defaults        config.Defaults
	priorityClasses map[string]string
}

func settingsOf(c config.Config) settings {
	return settings{
		limits: placement.Limits{SharesPerCard: c.SharesPerCard,
			MemoryRatio: c.MemoryOversubscriptionRatio, CoresRatio: c.CoresOversubscriptionRatio,
			HeartbeatTimeoutS: float64(c.HeartbeatTimeoutSeconds)},
		defaults:        c.Defaults,
		priorityClasses: c.PriorityClasses,
	}
}

func defaultSettings() settings { return settingsOf(config.Default()) }

// load reads the config file (config.LoadKeeping): an error when it is bad and no good one
// was kept, which stops the scheduler at start with the file's key named.
func (a Args) load() (settings, error) {
	loaded, err := config.LoadKeeping(a.ConfigFile, a.ConfigKeepDir)
	if err != nil {
		return settings{}, fmt.Errorf("%s: egpu config %s: %v", Name, a.ConfigFile, err)
	}
	reportConfig(loaded)
	if loaded.Err != "" {
		klog.ErrorS(nil, "egpu config is bad; running on the last good config until it is "+
			"fixed", "error", loaded.Err, "generation", loaded.Generation)
	} else {
		klog.InfoS("egpu config read", "file", a.ConfigFile, "generation", loaded.Generation)
	}
	return settingsOf(loaded.Config), nil
}
