package plugin

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/egpu/egpu/kube-scheduler/config"
)

// The plugin's metrics, beside kube-scheduler's own on its /metrics (../shared/CONTRACT.md,
// section "Metrics"): which config it runs, as every egpu part says it, and the binds its
// gate held.
var (
	configInfo = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Name: "egpu_config_info",
		Help: "The config a part runs: its generation (SHA-256 prefix of the config text) " +
			"and source (file, or last-good when the file is bad)",
		StabilityLevel: metrics.ALPHA,
	}, []string{"part", "generation", "source"})
	gateHeld = metrics.NewCounter(&metrics.CounterOpts{
		Name: "egpu_scheduler_bind_gate_held_total",
		Help: "Pods the bind gate held at Permit, a pod awaiting the kubelet's admission on " +
			"their node holding cards they could be handed",
		StabilityLevel: metrics.ALPHA,
	})
	registerOnce sync.Once
)

// schedulerPart is the part label of the scheduler's egpu_config_info.
const schedulerPart = "scheduler"

func registerMetrics() {
	registerOnce.Do(func() { legacyregistry.MustRegister(configInfo, gateHeld) })
}

// reportConfig makes egpu_config_info say the config the plugin runs, and only it.
func reportConfig(loaded config.Loaded) {
	registerMetrics()
	configInfo.Reset()
	configInfo.WithLabelValues(schedulerPart, loaded.Generation, loaded.Source).Set(1)
}
