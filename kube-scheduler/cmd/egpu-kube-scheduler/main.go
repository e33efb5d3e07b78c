// egpu-kube-scheduler is kube-scheduler with egpu's plugin, EgpuShares, registered
// (kube-scheduler/plugin). Run it with a KubeSchedulerConfiguration whose profile enables
// the plugin (docs/scheduler.md); every flag is kube-scheduler's.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/egpu/egpu/kube-scheduler/plugin"
)

func main() {
	command := app.NewSchedulerCommand(app.WithPlugin(plugin.Name, plugin.New))
	os.Exit(cli.Run(command))
}
