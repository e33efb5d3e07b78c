package plugin

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/egpu/egpu/kube-scheduler/placement"
	"github.com/egpu/egpu/kube-scheduler/pyrepr"
	"github.com/egpu/egpu/kube-scheduler/records"
)

// The pod's egpu names (../shared/CONTRACT.md, sections 1 and 2).
const (
	resGPU               = "egpu.io/gpu"
	resMemory            = "egpu.io/gpu-memory"
	resMemoryPercentage  = "egpu.io/gpu-memory-percentage"
	resCores             = "egpu.io/gpu-cores"
	labelPriority        = "egpu.io/priority" // the webhook's label
	annPriority          = "egpu.io/priority"
	annComputePolicy     = "egpu.io/compute-policy"
	annOversubscription  = "egpu.io/memory-oversubscription"
	annGPUPolicy         = "egpu.io/gpu-policy"
	annNodePolicy        = "egpu.io/node-policy"
	annUseType           = "egpu.io/use-gpu-type"
	annNouseType         = "egpu.io/nouse-gpu-type"
	annUseUUID           = "egpu.io/use-gpu-uuid"
	annNouseUUID         = "egpu.io/nouse-gpu-uuid"
	annAllocationModePod = "egpu.io/allocation-mode"
	maxGPUsPerContainer  = 16
	egpuPrefix           = "egpu.io/"       // every resource name under it is egpu's
	nativeGPU            = "nvidia.com/gpu" // whole cards, NVIDIA's device plugin's
)

// demand is what the plugin reads of a share pod: placement's demand, and what the
// allocation record says of the pod beside its cards.
type demand struct {
	placement.PodDemand
	shape         string            // the PodDemand as text: pods of one shape fit alike
	kinds         map[string]string // container -> its record kind
	priority      string
	computePolicy string
}

// problem is one mistake in a pod's shares, worded as egpu/requests.py RequestError.message:
// the container (or the pod's annotation), the field, the value, why, and what is allowed.
type problem struct{ container, field, value, reason, allowed string }

func (p problem) String() string {
	where := "pod annotation "
	if p.container != "" {
		where = fmt.Sprintf("container %s: ", pyrepr.String(clip(p.container)))
	}
	reason := ""
	if p.reason != "" {
		reason = " (" + p.reason + ")"
	}
	return fmt.Sprintf("%s%s=%s is not allowed%s; allowed: %s", where, p.field,
		pyrepr.String(clip(p.value)), reason, p.allowed)
}

// shownChars: a name or value in a message is cut to this many characters, then "..."
// (egpu.podshape.SHOWN_CHARS).
const shownChars = 60

// clip is egpu.podshape.clip: text cut to shownChars characters, with "..." when cut.
func clip(text string) string {
	if runes := []rune(text); len(runes) > shownChars {
		return string(runes[:shownChars]) + "..."
	}
	return text
}

func (p problem) Error() string { return p.String() }

// problems is every mistake of a pod, in the order egpu/requests.py finds them.
type problems []problem

func (ps problems) Error() string {
	texts := make([]string, len(ps))
	for i, p := range ps {
		texts[i] = p.String()
	}
	return strings.Join(texts, "; ")
}

// shareResource is one of egpu's resource names with the range it allows.
type shareResource struct {
	name      string
	low, high int64 // high 0: no bound
	unit      string
}

// shareResources are egpu's resource names (../shared/CONTRACT.md, section 1).
// In name order: the order in which egpu/requests.py checks them.
var shareResources = []shareResource{
	{resGPU, 1, maxGPUsPerContainer, ""},
	{resCores, 1, 100, " (%)"},
	{resMemory, 1, 0, " (MiB)"},
	{resMemoryPercentage, 1, 100, " (%)"},
}

// readDemand reads a pod's shares, or nil when no container asks for an egpu.io resource.
// It reads the egpu.io names of egpu/requests.py (not the config's aliases, which the webhook
// rewrites to them at admission) and refuses what the webhook refuses of them, every mistake
// in its words (problems): a name under egpu.io/ that is not egpu's, a share in requests only
// or with requests unlike its limits, a quantity that is not a whole number (or in binary
// units) or out of range, memory given both in MiB and in %, nvidia.com/gpu beside a share,
// a policy annotation not allowed, an empty entry in a card filter.
func readDemand(pod *v1.Pod, s settings) (*demand, error) {
	var containers []placement.ContainerDemand
	var errs problems
	kinds := map[string]string{}
	add := func(c *v1.Container, kind placement.Kind, recordKind string) {
		found, bad := containerResources(c)
		errs = append(errs, bad...)
		if len(found) == 0 || len(bad) > 0 {
			return
		}
		values := map[string]int64{}
		for _, r := range shareResources {
			q, ok := found[r.name]
			if !ok {
				continue
			}
			allowed := fmt.Sprintf("an integer %s%s", span(r.low, r.high), r.unit)
			n, whole := q.AsInt64()
			if !whole || q.Format == resource.BinarySI {
				reason := "not a whole number"
				if r.name == resMemory {
					reason += " (a plain number of MiB: 24Gi is 24576)"
				}
				errs = append(errs, problem{c.Name, r.name, q.String(), reason, allowed})
			} else if n < r.low || (r.high > 0 && n > r.high) {
				errs = append(errs, problem{c.Name, r.name, fmt.Sprint(n), "out of range", allowed})
			} else {
				values[r.name] = n
			}
		}
		mib, hasMiB := found[resMemory]
		pct, hasPct := found[resMemoryPercentage]
		if hasMiB && hasPct {
			errs = append(errs, problem{c.Name, resMemoryPercentage, shownQuantity(pct),
				fmt.Sprintf("%s=%s is given too", resMemory, shownQuantity(mib)),
				fmt.Sprintf("%s alone (MiB) or %s alone (%% of the card), not both",
					resMemory, resMemoryPercentage)})
			return
		}
		if len(values) != len(found) {
			return
		}
		share := placement.Share{GPUs: 1, Cores: int(values[resCores]), MemoryPercentage: 100}
		if n, ok := values[resGPU]; ok {
			share.GPUs = int(n)
		}
		if n, ok := values[resMemory]; ok {
			share.MemoryMiB, share.HasMemoryMiB, share.MemoryPercentage = int(n), true, 0
		} else if n, ok := values[resMemoryPercentage]; ok {
			share.MemoryPercentage = int(n)
		}
		containers = append(containers, placement.ContainerDemand{Name: c.Name, Kind: kind,
			Share: share, Order: len(containers)})
		kinds[c.Name] = recordKind
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		kind, recordKind := placement.Init, records.KindInit
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			kind, recordKind = placement.Sidecar, records.KindSidecar
		}
		add(c, kind, recordKind)
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i], placement.App, records.KindApp)
	}
	if len(containers) == 0 && len(errs) == 0 {
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
		return fallback, problem{"", key, v, "", strings.Join(allowed, ", ")}
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
				return nil, problem{"", key, v, "an empty entry",
					"a comma-separated list of non-empty names"}
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
	note := func(err error) {
		if p, ok := err.(problem); ok {
			errs = append(errs, p)
		}
	}
	fallback := s.defaults.Priority
	if p, ok := s.priorityClasses[pod.Spec.PriorityClassName]; ok {
		fallback = p
	}
	priority, err := choice(annPriority, fallback, "high", "low")
	note(err)
	if label := pod.Labels[labelPriority]; label == "high" || label == "low" {
		priority = label // the webhook's resolution, where valid
	}
	d.priority = priority
	d.computePolicy, err = choice(annComputePolicy, s.defaults.ComputePolicy, "strict", "elastic")
	note(err)
	oversubscribe, err := choice(annOversubscription, "false", "true", "false")
	note(err)
	d.Oversubscribe = oversubscribe == "true"
	for _, p := range []struct {
		key      string
		fallback placement.Policy
		into     *placement.Policy
	}{{annGPUPolicy, placement.Policy(s.defaults.GPUPolicy), &d.GPUPolicy},
		{annNodePolicy, placement.Policy(s.defaults.NodePolicy), &d.NodePolicy}} {
		v, err := choice(p.key, string(p.fallback), string(placement.Binpack),
			string(placement.Spread))
		note(err)
		*p.into = placement.Policy(v)
	}
	_, err = choice(annAllocationModePod, "", "extender", "dra")
	note(err)
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
		return nil, errs
	}
	// %#v quotes every string (a list ["a b"] and ["a", "b"] filter cards differently) and
	// prints maps in key order
	d.shape = fmt.Sprintf("%#v", d.PodDemand)
	return d, nil
}

// containerResources are the container's egpu.io resources by name (from limits) and the
// mistakes in how they are given (egpu/requests.py _container_resources, without aliases).
func containerResources(c *v1.Container) (map[string]resource.Quantity, problems) {
	limits, requests := c.Resources.Limits, c.Resources.Requests
	names := map[string]bool{}
	for name := range limits {
		names[string(name)] = true
	}
	for name := range requests {
		names[string(name)] = true
	}
	sorted := make([]string, 0, len(names))
	for name := range names {
		sorted = append(sorted, name)
	}
	slices.Sort(sorted)
	found := map[string]resource.Quantity{}
	var errs problems
	written := func(name string) string {
		if q, ok := limits[v1.ResourceName(name)]; ok {
			return q.String()
		}
		q := requests[v1.ResourceName(name)]
		return q.String()
	}
	for _, name := range sorted {
		if !slices.ContainsFunc(shareResources, func(r shareResource) bool {
			return r.name == name
		}) {
			if strings.HasPrefix(name, egpuPrefix) { // a misspelled share: never Pending
				errs = append(errs, problem{c.Name, name, written(name), "not an egpu resource",
					"one of " + strings.Join(shareNames(), ", ")})
			}
			continue
		}
		limit, inLimits := limits[v1.ResourceName(name)]
		request, inRequests := requests[v1.ResourceName(name)]
		switch {
		case !inLimits:
			errs = append(errs, problem{c.Name, name, request.String(),
				"extended resources are set in limits; requests alone are not enough",
				"the same value in resources.limits"})
		case inRequests && request.Cmp(limit) != 0:
			errs = append(errs, problem{c.Name, name + " (requests)", request.String(),
				"requests must equal limits", "the limits value " + limit.String()})
		default:
			found[name] = limit
		}
	}
	_, nvidiaLimit := limits[nativeGPU]
	_, nvidiaRequest := requests[nativeGPU]
	if len(found) > 0 && (nvidiaLimit || nvidiaRequest) {
		errs = append(errs, problem{c.Name, nativeGPU, written(nativeGPU), "",
			"either nvidia.com/gpu (whole cards) or egpu.io resources (shares), not both"})
	}
	return found, errs
}

// shareNames are egpu's resource names in the contract's order (egpu.contract.EGPU_RESOURCES).
func shareNames() []string {
	return []string{resGPU, resMemory, resMemoryPercentage, resCores}
}

// shownQuantity is a quantity as the author wrote it, where it is a whole number (the API
// server stores 4000 as "4k": show 4000).
func shownQuantity(q resource.Quantity) string {
	if n, ok := q.AsInt64(); ok && q.Format != resource.BinarySI {
		return fmt.Sprint(n)
	}
	return q.String()
}

// asksForShares: some container of the pod has an egpu.io/ limit.
func asksForShares(pod *v1.Pod) bool {
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			for name := range list[i].Resources.Limits {
				if strings.HasPrefix(string(name), egpuPrefix) {
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
