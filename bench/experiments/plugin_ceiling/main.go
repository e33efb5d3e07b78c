// Experiment (issue 24), not shipped: how fast kube-scheduler v1.37.2 binds egpu extender-path
// shares when the card placement runs inside it as a plugin instead of over the extender's
// HTTP verbs. Built as a kube-scheduler with one extra plugin, EgpuCardFit, run by
// bench/experiments/plugin_ceiling/run.py in place of the extender.
//
// EgpuCardFit places shares with the Go port of egpu's placement (kube-scheduler/placement:
// the whole fit rule and search, the effective-request bookings) over the records the
// extender reads (kube-scheduler/records: the node's egpu.io/inventory, the pods'
// egpu.io/allocation, each decoded once per text). Per pod: PreFilter reads its shares (a
// reader of the egpu.io/ limits and the placement annotations only: no aliases, no
// validation, which the port's pod reader will bring); Filter and Score fit it on the node
// with everything booked there (reservations of pods not yet seen bound included); Reserve
// holds the placement; Bind posts one Binding that carries the allocation record, as the
// extender does. The pod's priority and compute policy are written as the bench's pods
// resolve them (low, strict).
//
// With EGPU_BIND_GATE=1 it also runs the extender's bind gate (admission_conflict of
// scheduler/placement/kubelet.py) as a Permit wait: a pod whose shares of some size sit on
// other cards than those of a pod on its node that the kubelet has not admitted yet (bound,
// or let through and binding) waits, at most gateWait, until no such pod is left; pod events
// from the scheduler's own informer, and a sweep every sweepEvery, let the node's waiting
// pods through one at a time. With EGPU_GATE_SCORE=1 a node where the gate would hold the
// pod now scores 0 and every other node at least 1 (binpack's 0..10 scores a node with a
// share or two 0 too, and a tie sends pods to held nodes).
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/egpu/egpu/kube-scheduler/placement"
	"github.com/egpu/egpu/kube-scheduler/records"
)

const (
	name          = "EgpuCardFit"
	annInventory  = "egpu.io/inventory"
	annHeartbeat  = "egpu.io/inventory-heartbeat"
	annAllocation = "egpu.io/allocation"
	stateKey      = fwk.StateKey(name)
	gateWait      = 8 * time.Second // the extender's BIND_GATE_WAIT_S
	sweepEvery    = 100 * time.Millisecond
)

// limits are bench/scheduling.py's config (sharesPerCard 4, heartbeatTimeoutSeconds 3600)
// over egpu's defaults (the ratios).
var limits = placement.Limits{SharesPerCard: 4, MemoryRatio: 1.5, CoresRatio: 1.0,
	HeartbeatTimeoutS: 3600}

// demandState is the pod's shares and, with EGPU_FIT_MEMO=1, each node's fit in this
// scheduling cycle: Filter fits the pod once per node, Score and Reserve read that answer (the
// snapshot does not change within a cycle; a reservation freed meanwhile only leaves more room).
type demandState struct {
	demand placement.PodDemand
	mu     sync.Mutex
	fits   map[string]fitAnswer
}

type fitAnswer struct {
	placed *placement.Placement
	unfit  *placement.Unfit
}

func (d *demandState) Clone() fwk.StateData { return d }

type parsedNode struct {
	inventory, heartbeat string // the annotations' texts
	state                placement.NodeState
}

// bookedNode is a node's state with all its pods' bookings, for one NodeInfo generation
// (with EGPU_NODE_CACHE=1): a pod added, removed or updated there (its record written at
// bind) changes the generation. Not used for a pod that is itself on the node.
type bookedNode struct {
	generation int64
	base       placement.NodeState // the parsed state it was built on
	state      placement.NodeState
}

// sizes is a pod's card sets per slot count (scheduler/placement/kubelet.py sizes): what
// GetPreferredAllocation and Allocate can tell a pod by.
type sizes map[int]map[string]bool

func sizesOf(p *placement.Placement) sizes {
	out := sizes{}
	for _, c := range p.Containers {
		uuids := make([]string, 0, len(c.Cards))
		for _, s := range c.Cards {
			uuids = append(uuids, s.UUID)
		}
		sort.Strings(uuids)
		if out[len(uuids)] == nil {
			out[len(uuids)] = map[string]bool{}
		}
		out[len(uuids)][strings.Join(uuids, ",")] = true
	}
	return out
}

// conflicts is admission_conflict for two pods: for some slot count, their containers of
// that size use more than one card set between them.
func (mine sizes) conflicts(theirs sizes) bool {
	for size, sets := range mine {
		seen, ok := theirs[size]
		if !ok {
			continue
		}
		union := len(seen)
		for s := range sets {
			if !seen[s] {
				union++
			}
		}
		if union > 1 {
			return true
		}
	}
	return false
}

type reservation struct {
	node      string
	placement *placement.Placement
}

type plugin struct {
	handle fwk.Handle
	mu     sync.Mutex
	nodes  map[string]parsedNode                          // node -> its records, by text
	booked map[types.UID]map[string]placement.CardBooking // pod -> what its record books
	held   map[types.UID]reservation                      // pod -> its placement, until seen bound
	states map[string]bookedNode                          // node -> booked state, per generation

	fitMemo, nodeCache bool

	gate, gateScore bool
	gateMu          sync.Mutex
	unadmitted      map[string]map[types.UID]sizes // node -> pods its kubelet has not admitted
	waiting         map[string]map[types.UID]sizes // node -> pods held at Permit
	holds, lets     int
}

func newPlugin(_ context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	p := &plugin{handle: h, nodes: map[string]parsedNode{},
		booked:     map[types.UID]map[string]placement.CardBooking{},
		held:       map[types.UID]reservation{},
		states:     map[string]bookedNode{},
		fitMemo:    os.Getenv("EGPU_FIT_MEMO") == "1",
		nodeCache:  os.Getenv("EGPU_NODE_CACHE") == "1",
		gate:       os.Getenv("EGPU_BIND_GATE") == "1",
		gateScore:  os.Getenv("EGPU_GATE_SCORE") == "1",
		unadmitted: map[string]map[types.UID]sizes{},
		waiting:    map[string]map[types.UID]sizes{}}
	if p.gate {
		_, err := h.SharedInformerFactory().Core().V1().Pods().Informer().AddEventHandler(
			cache.ResourceEventHandlerFuncs{
				AddFunc:    func(o interface{}) { p.observe(o, false) },
				UpdateFunc: func(_, o interface{}) { p.observe(o, false) },
				DeleteFunc: func(o interface{}) { p.observe(o, true) },
			})
		if err != nil {
			return nil, err
		}
		go p.sweep()
	}
	return p, nil
}

func (p *plugin) Name() string { return name }

// readDemand reads the pod's shares: egpu.io/ limits of its init containers (sidecars:
// restartPolicy Always) and containers, and the placement annotations. nil: no share.
func readDemand(pod *v1.Pod) *placement.PodDemand {
	var containers []placement.ContainerDemand
	add := func(c *v1.Container, kind placement.Kind) {
		l := c.Resources.Limits
		value := func(res string) (int, bool) {
			q, ok := l[v1.ResourceName(res)]
			return int(q.Value()), ok
		}
		gpus, hasGPU := value("egpu.io/gpu")
		mib, hasMiB := value("egpu.io/gpu-memory")
		pct, hasPct := value("egpu.io/gpu-memory-percentage")
		cores, hasCores := value("egpu.io/gpu-cores")
		if !hasGPU && !hasMiB && !hasPct && !hasCores {
			return
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
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		kind := placement.Init
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			kind = placement.Sidecar
		}
		add(c, kind)
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i], placement.App)
	}
	if len(containers) == 0 {
		return nil
	}
	a := pod.Annotations
	policy := func(key string) placement.Policy {
		if v, err := placement.ParsePolicy(a[key]); err == nil {
			return v
		}
		return placement.Binpack
	}
	list := func(key string) []string {
		if a[key] == "" {
			return nil
		}
		return strings.Split(a[key], ",")
	}
	set := func(key string) map[string]bool {
		out := map[string]bool{}
		for _, v := range list(key) {
			out[v] = true
		}
		return out
	}
	return &placement.PodDemand{Containers: placement.NewPodDemand(containers),
		Oversubscribe: a["egpu.io/memory-oversubscription"] == "true",
		UseTypes:      list("egpu.io/use-gpu-type"), NouseTypes: list("egpu.io/nouse-gpu-type"),
		UseUUIDs: set("egpu.io/use-gpu-uuid"), NouseUUIDs: set("egpu.io/nouse-gpu-uuid"),
		GPUPolicy: policy("egpu.io/gpu-policy"), NodePolicy: policy("egpu.io/node-policy")}
}

func (p *plugin) PreFilter(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	_ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	d := readDemand(pod)
	if d == nil {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	state.Write(stateKey, &demandState{demand: *d, fits: map[string]fitAnswer{}})
	return nil, nil
}

func (p *plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// parsed is the node's cards and heartbeat, decoded once per annotation text. Caller holds mu.
func (p *plugin) parsed(node *v1.Node) placement.NodeState {
	inv, hb := node.Annotations[annInventory], node.Annotations[annHeartbeat]
	if got, ok := p.nodes[node.Name]; ok && got.inventory == inv && got.heartbeat == hb {
		return got.state
	}
	state := placement.NodeState{Name: node.Name}
	if t, err := time.Parse(time.RFC3339, hb); err == nil {
		unix := float64(t.Unix())
		state.Heartbeat = &unix
	}
	if decoded, err := records.DecodeInventory(inv); err != nil {
		state.Problem = "egpu inventory unreadable: " + err.Error()
	} else {
		for _, c := range decoded.Cards {
			state.Cards = append(state.Cards, placement.CardState{UUID: c.UUID,
				Index: int(c.Index), Model: c.Model, CapacityMiB: int(c.MemoryMiB),
				Healthy: c.Healthy})
		}
	}
	p.nodes[node.Name] = parsedNode{inv, hb, state}
	return state
}

// bookingsOf is what the pod's allocation record books, decoded once per pod (nil: no
// record). Caller holds mu.
func (p *plugin) bookingsOf(pod *v1.Pod) map[string]placement.CardBooking {
	if got, ok := p.booked[pod.UID]; ok {
		return got
	}
	text, ok := pod.Annotations[annAllocation]
	if !ok {
		return nil
	}
	var out map[string]placement.CardBooking
	if a, err := records.DecodeAllocation(text); err == nil {
		out = placement.BookingsOf(a)
	}
	p.booked[pod.UID] = out
	return out
}

// nodeState is the node's cards with everything booked there but the pod's own: the pods'
// records, and the reservations of pods not yet seen bound. Caller holds mu.
func (p *plugin) nodeState(info fwk.NodeInfo, self types.UID) placement.NodeState {
	base := p.parsed(info.Node())
	cache := p.nodeCache
	if cache {
		for _, pi := range info.GetPods() {
			cache = cache && pi.GetPod().UID != self // the pod's own booking is left out
		}
		got, ok := p.states[base.Name]
		if cache && ok && got.generation == info.GetGeneration() && sameBase(got.base, base) {
			return got.state
		}
	}
	use := map[string]placement.CardBooking{}
	add := func(b map[string]placement.CardBooking) {
		for uuid, x := range b {
			u := use[uuid]
			use[uuid] = placement.CardBooking{MemoryMiB: u.MemoryMiB + x.MemoryMiB,
				Cores: u.Cores + x.Cores, Slots: u.Slots + x.Slots}
		}
	}
	for _, pi := range info.GetPods() {
		pod := pi.GetPod()
		if pod.UID == self {
			continue
		}
		if b := p.bookingsOf(pod); b != nil {
			add(b)
			delete(p.held, pod.UID) // its record now says what the reservation did
		} else if r, ok := p.held[pod.UID]; ok && r.node == base.Name {
			add(r.placement.Bookings)
		}
	}
	state := base
	state.Cards = make([]placement.CardState, len(base.Cards))
	for i, c := range base.Cards {
		u := use[c.UUID]
		c.BookedMiB, c.BookedCores, c.UsedSlots = u.MemoryMiB, u.Cores, u.Slots
		state.Cards[i] = c
	}
	if cache {
		p.states[base.Name] = bookedNode{info.GetGeneration(), base, state}
	}
	return state
}

// sameBase: the cached booked state was built on these parsed records (a new inventory or
// heartbeat text parses to a new Cards slice).
func sameBase(a, b placement.NodeState) bool {
	return a.Heartbeat == b.Heartbeat && a.Problem == b.Problem &&
		(len(a.Cards) == 0 && len(b.Cards) == 0 || len(a.Cards) == len(b.Cards) &&
			&a.Cards[0] == &b.Cards[0])
}

func (p *plugin) fit(state fwk.CycleState, pod *v1.Pod, info fwk.NodeInfo) (
	*placement.Placement, *placement.Unfit, error) {
	data, err := state.Read(stateKey)
	if err != nil {
		return nil, nil, err
	}
	d := data.(*demandState)
	name := info.Node().Name
	if p.fitMemo {
		d.mu.Lock()
		got, ok := d.fits[name]
		d.mu.Unlock()
		if ok {
			return got.placed, got.unfit, nil
		}
	}
	p.mu.Lock()
	node := p.nodeState(info, pod.UID)
	p.mu.Unlock()
	placed, unfit := placement.Fit(node, d.demand, limits, float64(time.Now().Unix()))
	if p.fitMemo {
		d.mu.Lock()
		d.fits[name] = fitAnswer{placed, unfit}
		d.mu.Unlock()
	}
	return placed, unfit, nil
}

func (p *plugin) Filter(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	info fwk.NodeInfo) *fwk.Status {
	_, unfit, err := p.fit(state, pod, info)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if unfit != nil {
		code := fwk.Unschedulable
		if unfit.Unresolvable {
			code = fwk.UnschedulableAndUnresolvable
		}
		return fwk.NewStatus(code, unfit.Reason)
	}
	return nil
}

// Score is the node strategy's score (0..10, scaled to MaxNodeScore); 0 where the gate
// would hold the pod now, with EGPU_GATE_SCORE=1.
func (p *plugin) Score(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	info fwk.NodeInfo) (int64, *fwk.Status) {
	placed, _, err := p.fit(state, pod, info)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	if placed == nil {
		return 0, nil
	}
	if p.gateScore {
		p.gateMu.Lock()
		held := p.conflict(info.Node().Name, pod.UID, sizesOf(placed))
		p.gateMu.Unlock()
		if held {
			return 0, nil
		}
	}
	d, _ := state.Read(stateKey)
	score := int64(placement.NodeScore(d.(*demandState).demand.NodePolicy,
		placed.Utilization)) * fwk.MaxNodeScore / 10
	if p.gateScore { // a node that takes the pod at once outranks one that would hold it
		score = max(1, score)
	}
	return score, nil
}

func (p *plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

func (p *plugin) Reserve(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	nodeName string) *fwk.Status {
	info, err := p.handle.SnapshotSharedLister().NodeInfos().Get(nodeName)
	if err != nil {
		return fwk.AsStatus(err)
	}
	placed, unfit, err := p.fit(state, pod, info)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if unfit != nil {
		return fwk.NewStatus(fwk.Unschedulable, "the node no longer fits: "+unfit.Reason)
	}
	p.mu.Lock()
	p.held[pod.UID] = reservation{nodeName, placed}
	p.mu.Unlock()
	return nil
}

func (p *plugin) Unreserve(_ context.Context, _ fwk.CycleState, pod *v1.Pod, node string) {
	p.mu.Lock()
	delete(p.held, pod.UID)
	p.mu.Unlock()
	p.gateMu.Lock()
	defer p.gateMu.Unlock()
	delete(p.waiting[node], pod.UID)
	if _, was := p.unadmitted[node][pod.UID]; was {
		delete(p.unadmitted[node], pod.UID)
		p.release(node)
	}
}

// sweep releases waiting pods every sweepEvery: a pod event between Permit's Wait and the
// framework's listing of the pod as waiting finds no waiting pod to allow.
func (p *plugin) sweep() {
	for range time.Tick(sweepEvery) {
		p.gateMu.Lock()
		for node, pods := range p.waiting {
			if len(pods) > 0 {
				p.release(node)
			}
		}
		p.gateMu.Unlock()
	}
}

// admitted is egpu.kube.KubePod.admitted: the kubelet wrote what it writes only after
// admission (or a rejection).
func admitted(pod *v1.Pod) bool {
	s := pod.Status
	return s.StartTime != nil || (s.Phase != "" && s.Phase != v1.PodPending) ||
		len(s.ContainerStatuses) > 0 || len(s.InitContainerStatuses) > 0
}

// observe keeps unadmitted in step with the informer's pods and wakes the node's waiting pods
// when one of its pods is admitted or gone.
func (p *plugin) observe(o interface{}, deleted bool) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	pod, ok := o.(*v1.Pod)
	if !ok {
		return
	}
	p.gateMu.Lock()
	defer p.gateMu.Unlock()
	if deleted || admitted(pod) {
		for node, pods := range p.unadmitted { // a final state unknown may predate its binding
			if _, was := pods[pod.UID]; was {
				delete(pods, pod.UID)
				p.release(node)
			}
		}
		return
	}
	node := pod.Spec.NodeName
	if node == "" {
		return
	}
	if _, known := p.unadmitted[node][pod.UID]; known {
		return
	}
	text, ok := pod.Annotations[annAllocation]
	if !ok {
		return
	}
	if a, err := records.DecodeAllocation(text); err == nil {
		p.mark(p.unadmitted, node, pod.UID, recordSizes(a))
	}
}

func recordSizes(a records.Allocation) sizes {
	placed := &placement.Placement{}
	for _, c := range a.Containers {
		var cards []placement.CardShare
		for _, s := range c.Cards {
			cards = append(cards, placement.CardShare{UUID: s.UUID})
		}
		placed.Containers = append(placed.Containers, placement.ContainerAllocation{
			Name: c.Name, Cards: cards})
	}
	return sizesOf(placed)
}

func (p *plugin) mark(m map[string]map[types.UID]sizes, node string, uid types.UID, s sizes) {
	if m[node] == nil {
		m[node] = map[types.UID]sizes{}
	}
	m[node][uid] = s
}

// conflict: binding a pod of these sizes to node now could let the kubelet hand it another
// pod's slots (a pod there not admitted yet). Caller holds gateMu.
func (p *plugin) conflict(node string, uid types.UID, mine sizes) bool {
	for other, theirs := range p.unadmitted[node] {
		if other != uid && mine.conflicts(theirs) {
			return true
		}
	}
	return false
}

// release lets through each pod waiting on node that no longer conflicts, one at a time (each
// one let through counts for the next). Caller holds gateMu.
func (p *plugin) release(node string) {
	for uid, mine := range p.waiting[node] {
		if p.conflict(node, uid, mine) {
			continue
		}
		wp := p.handle.GetWaitingPod(uid)
		if wp == nil {
			continue // not in the framework's wait yet (Permit returns first), or gone
		}
		delete(p.waiting[node], uid)
		p.mark(p.unadmitted, node, uid, mine)
		p.lets++
		wp.Allow(name)
	}
}

func (p *plugin) Permit(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	nodeName string) (*fwk.Status, time.Duration) {
	if _, err := state.Read(stateKey); err != nil || !p.gate {
		return nil, 0 // not a share pod, or no gate
	}
	p.mu.Lock()
	r, ok := p.held[pod.UID]
	p.mu.Unlock()
	if !ok {
		return fwk.NewStatus(fwk.Error, "no reservation for the pod"), 0
	}
	mine := sizesOf(r.placement)
	p.gateMu.Lock()
	defer p.gateMu.Unlock()
	if p.conflict(nodeName, pod.UID, mine) {
		p.mark(p.waiting, nodeName, pod.UID, mine)
		p.holds++
		if p.holds%50 == 1 {
			klog.InfoS("egpu bind gate", "holds", p.holds, "letThrough", p.lets)
		}
		return fwk.NewStatus(fwk.Wait, "a pod awaiting admission holds other cards"), gateWait
	}
	p.mark(p.unadmitted, nodeName, pod.UID, mine)
	return nil, 0
}

func (p *plugin) Bind(ctx context.Context, state fwk.CycleState, pod *v1.Pod,
	nodeName string) *fwk.Status {
	d, err := state.Read(stateKey)
	if err != nil {
		return fwk.NewStatus(fwk.Skip)
	}
	p.mu.Lock()
	r, ok := p.held[pod.UID]
	p.mu.Unlock()
	if !ok {
		return fwk.NewStatus(fwk.Error, "no reservation for the pod")
	}
	kinds := map[string]string{}
	for _, c := range d.(*demandState).demand.Containers {
		kinds[c.Name] = map[placement.Kind]string{placement.App: records.KindApp,
			placement.Init: records.KindInit, placement.Sidecar: records.KindSidecar}[c.Kind]
	}
	priority, policy, oversubscribe := "low", "strict", d.(*demandState).demand.Oversubscribe
	a := records.Allocation{Node: nodeName, Priority: &priority, ComputePolicy: &policy,
		MemoryOversubscription: &oversubscribe}
	for _, c := range r.placement.Containers {
		ca := records.ContainerAllocation{Name: c.Name, Kind: kinds[c.Name], Init: c.Init}
		for _, s := range c.Cards {
			ca.Cards = append(ca.Cards, records.CardShare{UUID: s.UUID, Index: int64(s.Index),
				MemoryMiB: int64(s.MemoryMiB), Cores: int64(s.Cores)})
		}
		a.Containers = append(a.Containers, ca)
	}
	text, err := a.Encode()
	if err != nil {
		return fwk.AsStatus(err)
	}
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			Annotations: map[string]string{annAllocation: text}},
		Target: v1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	err = p.handle.ClientSet().CoreV1().Pods(pod.Namespace).Bind(ctx, binding,
		metav1.CreateOptions{})
	if err != nil {
		return fwk.AsStatus(fmt.Errorf("binding %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	return nil
}

func main() {
	command := app.NewSchedulerCommand(app.WithPlugin(name, newPlugin))
	os.Exit(cli.Run(command))
}
