package plugin

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/egpu/egpu/kube-scheduler/placement"
	"github.com/egpu/egpu/kube-scheduler/records"
)

// The pod's egpu names (../shared/CONTRACT.md, sections 1 and 2).
const (
	resGPU              = "egpu.io/gpu"
	resMemory           = "egpu.io/gpu-memory"
	resMemoryPercentage = "egpu.io/gpu-memory-percentage"
	resCores            = "egpu.io/gpu-cores"
	labelPriority       = "egpu.io/priority" // the webhook's label
	annPriority         = "egpu.io/priority"
	annComputePolicy    = "egpu.io/compute-policy"
	annOversubscription = "egpu.io/memory-oversubscription"
	annGPUPolicy        = "egpu.io/gpu-policy"
	annNodePolicy       = "egpu.io/node-policy"
	annUseType          = "egpu.io/use-gpu-type"
	annNouseType        = "egpu.io/nouse-gpu-type"
	annUseUUID          = "egpu.io/use-gpu-uuid"
	annNouseUUID        = "egpu.io/nouse-gpu-uuid"
	maxGPUsPerContainer = 16
)

// demand is what the plugin reads of a share pod: placement's demand, and what the
// allocation record says of the pod beside its cards.
type demand struct {
	placement.PodDemand
	kinds         map[string]string // container -> its record kind
	priority      string
	computePolicy string
}

// readDemand reads a pod's shares, or nil when no container asks for an egpu.io resource.
// It reads the egpu.io names of egpu/requests.py (not the config's aliases, which the webhook
// rewrites to them at admission) and refuses, naming the container, the resource, the value
// and what is allowed, what the webhook refuses: a quantity that is not a whole number (or
// in binary units), out of range, or memory given both in MiB and in %, a policy annotation
// not allowed, an empty entry in a card filter.
func readDemand(pod *v1.Pod, args Args) (*demand, error) {
	var containers []placement.ContainerDemand
	kinds := map[string]string{}
	add := func(c *v1.Container, kind placement.Kind, recordKind string) error {
		value := func(res string, low, high int64) (int, bool, error) {
			q, ok := c.Resources.Limits[v1.ResourceName(res)]
			if !ok {
				return 0, false, nil
			}
			n, whole := q.AsInt64()
			if !whole || q.Format == resource.BinarySI {
				return 0, true, fmt.Errorf("container '%s': %s=%s is not allowed (not a whole "+
					"number); allowed: an integer %s", c.Name, res, q.String(), span(low, high))
			}
			if n < low || (high > 0 && n > high) {
				return 0, true, fmt.Errorf("container '%s': %s=%d is not allowed (out of "+
					"range); allowed: an integer %s", c.Name, res, n, span(low, high))
			}
			return int(n), true, nil
		}
		gpus, hasGPU, err := value(resGPU, 1, maxGPUsPerContainer)
		if err != nil {
			return err
		}
		mib, hasMiB, err := value(resMemory, 1, 0)
		if err != nil {
			return err
		}
		pct, hasPct, err := value(resMemoryPercentage, 1, 100)
		if err != nil {
			return err
		}
		cores, hasCores, err := value(resCores, 1, 100)
		if err != nil {
			return err
		}
		if !hasGPU && !hasMiB && !hasPct && !hasCores {
			return nil
		}
		if hasMiB && hasPct {
			return fmt.Errorf("container '%s': %s=%d is not allowed (%s=%d is given too); "+
				"allowed: %s alone (MiB) or %s alone (%% of the card), not both", c.Name,
				resMemoryPercentage, pct, resMemory, mib, resMemory, resMemoryPercentage)
		}
		share := placement.Share{GPUs: 1, Cores: cores, MemoryPercentage: 100}
		if hasGPU {
			share.GPUs = gpus
		}
		if hasMiB {
			share.MemoryMiB, share.HasMemoryMiB, share.MemoryPercentage = mib, true, 0
		} else if hasPct {
			share.MemoryPercentage = pct
		}
		containers = append(containers, placement.ContainerDemand{Name: c.Name, Kind: kind,
			Share: share, Order: len(containers)})
		kinds[c.Name] = recordKind
		return nil
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		kind, recordKind := placement.Init, records.KindInit
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			kind, recordKind = placement.Sidecar, records.KindSidecar
		}
		if err := add(c, kind, recordKind); err != nil {
			return nil, err
		}
	}
	for i := range pod.Spec.Containers {
		if err := add(&pod.Spec.Containers[i], placement.App, records.KindApp); err != nil {
			return nil, err
		}
	}
	if len(containers) == 0 {
		return nil, nil
	}
	a := pod.Annotations
	choice := func(key, fallback string, allowed ...string) (string, error) {
		v, ok := a[key]
		if !ok {
			return fallback, nil
		}
		for _, x := range allowed {
			if v == x {
				return v, nil
			}
		}
		return "", fmt.Errorf("pod annotation %s=%q is not allowed; allowed: %s", key, v,
			strings.Join(allowed, ", "))
	}
	list := func(key string) ([]string, error) {
		v, ok := a[key]
		if !ok {
			return nil, nil
		}
		items := strings.Split(v, ",")
		for i := range items {
			items[i] = strings.TrimSpace(items[i])
			if items[i] == "" {
				return nil, fmt.Errorf("pod annotation %s=%q is not allowed (an empty entry); "+
					"allowed: a comma-separated list of non-empty names", key, v)
			}
		}
		return items, nil
	}
	set := func(items []string) map[string]bool {
		out := map[string]bool{}
		for _, v := range items {
			out[v] = true
		}
		return out
	}
	d := &demand{kinds: kinds}
	d.Containers = placement.NewPodDemand(containers)
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	priority, err := choice(annPriority, args.Priority, "high", "low")
	note(err)
	if label := pod.Labels[labelPriority]; label == "high" || label == "low" {
		priority = label // the webhook's resolution, where valid
	}
	d.priority = priority
	d.computePolicy, err = choice(annComputePolicy, args.ComputePolicy, "strict", "elastic")
	note(err)
	oversubscribe, err := choice(annOversubscription, "false", "true", "false")
	note(err)
	d.Oversubscribe = oversubscribe == "true"
	for _, p := range []struct {
		key      string
		fallback placement.Policy
		into     *placement.Policy
	}{{annGPUPolicy, args.GPUPolicy, &d.GPUPolicy}, {annNodePolicy, args.NodePolicy, &d.NodePolicy}} {
		v, err := choice(p.key, string(p.fallback), string(placement.Binpack),
			string(placement.Spread))
		note(err)
		*p.into = placement.Policy(v)
	}
	d.UseTypes, err = list(annUseType)
	note(err)
	d.NouseTypes, err = list(annNouseType)
	note(err)
	use, err := list(annUseUUID)
	note(err)
	nouse, err := list(annNouseUUID)
	note(err)
	d.UseUUIDs, d.NouseUUIDs = set(use), set(nouse)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return d, nil
}

// asksForShares: some container of the pod has an egpu.io/ limit.
func asksForShares(pod *v1.Pod) bool {
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			for name := range list[i].Resources.Limits {
				if strings.HasPrefix(string(name), "egpu.io/") {
					return true
				}
			}
		}
	}
	return false
}

// span is the allowed range as the webhook words it.
func span(low, high int64) string {
	if high > 0 {
		return fmt.Sprintf("%d..%d", low, high)
	}
	return fmt.Sprintf(">= %d", low)
}
