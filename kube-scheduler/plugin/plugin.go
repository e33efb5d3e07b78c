// Package plugin is EgpuShares: egpu's card placement inside kube-scheduler (issue 24,
// docs/scheduler.md "The placement inside kube-scheduler"), in place of the extender's HTTP
// verbs. For a pod with shares (egpu.io/ limits):
//
//   - PreFilter reads its shares (readDemand); a pod without any is skipped, a malformed one
//     refused with the webhook's words;
//   - Filter fits it on each node with everything booked there (placement.Fit over the
//     node's egpu.io/inventory and its pods' egpu.io/allocation records, and the
//     reservations of pods not yet bound), once per node and scheduling cycle: Score and
//     Reserve read that answer;
//   - Score is the node strategy's score, 0 where the bind gate would hold the pod now and
//     at least 1 elsewhere, so that pods go where they bind at once;
//   - Reserve holds the placement until the pod's record is seen; Unreserve lets it go;
//   - Permit is the bind gate (package gate): the pod waits, at most gateWait, while a pod on
//     its node that the kubelet has not admitted yet could be handed its cards;
//   - Bind posts one Binding whose annotations carry the egpu.io/allocation record (the API
//     server copies them onto the pod with spec.nodeName), as the retired extender did.
package plugin

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/egpu/egpu/kube-scheduler/gate"
	"github.com/egpu/egpu/kube-scheduler/placement"
	"github.com/egpu/egpu/kube-scheduler/records"
)

// Name is the plugin's name in a scheduler profile.
const Name = "EgpuShares"

const (
	stateKey   = fwk.StateKey(Name)
	gateWait   = 8 * time.Second        // the bind gate's longest hold
	sweepEvery = 100 * time.Millisecond // how often held pods get their turn again
	// bindTimeout bounds the Binding's POST, and apart from it its read-back: under the 15 s
	// leader lease, so that no Binding of a leader that lost its lease lands after the next
	// leader placed other pods on the cards
	bindTimeout = 4 * time.Second
	// how long a node's last fit answers a pod of the same shape on the same generation: a
	// node whose heartbeat goes stale meanwhile is refused at most this late
	shapeFitFor = 500 * time.Millisecond
)

// instances: whether New has made the plugin (one per scheduler process).
var instances atomic.Bool

// reservation is a pod's placement from Reserve until its record is seen.
type reservation struct {
	node      string
	placement *placement.Placement
}

// Plugin is EgpuShares. Safe for the scheduler's concurrent calls.
type Plugin struct {
	handle   fwk.Handle
	settings settings
	gate     *gate.Gate
	holds    atomic.Int64

	mu     sync.Mutex
	nodes  map[string]*parsedNode    // node -> its annotations, parsed
	states map[string]bookedNode     // node -> booked state, per generation
	held   map[types.UID]reservation // pod -> placement, until seen bound
	shapes map[string]shapeFit       // node -> its last fit, by the pod's shape
	now    func() time.Time
}

var (
	_ fwk.PreFilterPlugin = (*Plugin)(nil)
	_ fwk.FilterPlugin    = (*Plugin)(nil)
	_ fwk.PreScorePlugin  = (*Plugin)(nil)
	_ fwk.ScorePlugin     = (*Plugin)(nil)
	_ fwk.ReservePlugin   = (*Plugin)(nil)
	_ fwk.PermitPlugin    = (*Plugin)(nil)
	_ fwk.BindPlugin      = (*Plugin)(nil)
)

// New is the plugin's factory (app.WithPlugin(Name, New)): it reads its args (DecodeArgs) and
// egpu's config file they name, watches pods through the scheduler's own informer (records, admissions, deletions) and
// sweeps the gate until ctx ends.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	if !instances.CompareAndSwap(false, true) {
		// each profile's instance would hold its own reservations and gate, and not see the
		// other's pods awaiting their records: cards booked twice
		return nil, fmt.Errorf("%s is enabled in more than one scheduler profile; enable it "+
			"in one", Name)
	}
	args, err := DecodeArgs(obj)
	if err != nil {
		return nil, err
	}
	s, err := args.load()
	if err != nil {
		return nil, err
	}
	p := newPlugin(h, s)
	informers := h.SharedInformerFactory().Core().V1()
	_, err = informers.Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { p.observe(o, false) },
		UpdateFunc: func(_, o any) { p.observe(o, false) },
		DeleteFunc: func(o any) { p.observe(o, true) },
	})
	if err != nil {
		return nil, err
	}
	_, err = informers.Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: p.forgetNode,
	})
	if err != nil {
		return nil, err
	}
	go func() {
		tick := time.NewTicker(sweepEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				p.gate.Sweep(p.let)
			}
		}
	}()
	return p, nil
}

func newPlugin(h fwk.Handle, s settings) *Plugin {
	return &Plugin{handle: h, settings: s, gate: gate.New(),
		nodes: map[string]*parsedNode{}, states: map[string]bookedNode{},
		held: map[types.UID]reservation{}, shapes: map[string]shapeFit{}, now: time.Now}
}

// Name is the plugin's name.
func (p *Plugin) Name() string { return Name }

// cycle is the pod's shares and, per node, its fit in this scheduling cycle. A fit answers
// only the NodeInfo generation it was made on (fitAnswer), which keeps preemption's dry runs
// and the passes with nominated pods right; a clone (those runs) starts with no fits only so
// that its answers do not push the cycle's own out.
type cycle struct {
	demand *demand
	mu     sync.Mutex
	fits   map[string]fitAnswer
}

// fitAnswer is the pod's fit on one node, for the NodeInfo generation it was made on: the
// scheduler's Filter, Score and Reserve of one cycle see one snapshot, and a preemption dry
// run (victims removed, then added back one by one) or a pass with nominated pods added sees
// other generations.
type fitAnswer struct {
	generation int64
	placed     *placement.Placement
	unfit      *placement.Unfit
}

func (c *cycle) Clone() fwk.StateData {
	return &cycle{demand: c.demand, fits: map[string]fitAnswer{}}
}

func cycleOf(state fwk.CycleState) *cycle {
	data, err := state.Read(stateKey)
	if err != nil {
		return nil
	}
	return data.(*cycle)
}

// PreFilter reads the pod's shares: Skip for a pod without any, UnschedulableAndUnresolvable
// (with the webhook's words) for a pod whose shares do not read.
func (p *Plugin) PreFilter(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	_ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	d, err := readDemand(pod, p.settings)
	if err != nil {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			"invalid egpu request: "+err.Error())
	}
	if d == nil {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	state.Write(stateKey, &cycle{demand: d, fits: map[string]fitAnswer{}})
	return nil, nil
}

// PreFilterExtensions: none (a pod's own reservations are left out by UID).
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// fit is the pod's fit on the node in this cycle: Filter's answer when it gave one.
func (p *Plugin) fit(c *cycle, pod *v1.Pod, info fwk.NodeInfo) fitAnswer {
	name, generation := info.Node().Name, info.GetGeneration()
	c.mu.Lock()
	got, ok := c.fits[name]
	c.mu.Unlock()
	if ok && got.generation == generation {
		return got
	}
	now := p.now()
	p.mu.Lock()
	node, own := p.nodeState(info, pod.UID)
	last, seen := p.shapes[name]
	p.mu.Unlock()
	if own && seen && last.shape == c.demand.shape && last.answer.generation == generation &&
		now.Sub(last.at) < shapeFitFor {
		got = last.answer
	} else {
		placed, unfit := placement.Fit(node, c.demand.PodDemand, p.settings.limits,
			float64(now.Unix()))
		got = fitAnswer{generation, placed, unfit}
		if own {
			p.mu.Lock()
			p.shapes[name] = shapeFit{c.demand.shape, now, got}
			p.mu.Unlock()
		}
	}
	c.mu.Lock()
	c.fits[name] = got
	c.mu.Unlock()
	return got
}

// shapeFit is the last fit on a node: the pod's shape (its demand, whatever its name) and
// when, for one NodeInfo generation. The replicas of a Deployment share a shape, and the
// scheduler examines each node again every few pods of a burst, most often unchanged.
type shapeFit struct {
	shape  string
	at     time.Time
	answer fitAnswer
}

// Filter passes a node where the pod's shares fit; else Unschedulable with placement's
// reason, or UnschedulableAndUnresolvable where they would not fit the node emptied of other
// pods' shares (preempting cannot help).
func (p *Plugin) Filter(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	info fwk.NodeInfo) *fwk.Status {
	c := cycleOf(state)
	if c == nil {
		return nil
	}
	if unfit := p.fit(c, pod, info).unfit; unfit != nil {
		code := fwk.Unschedulable
		if unfit.Unresolvable {
			code = fwk.UnschedulableAndUnresolvable
		}
		return fwk.NewStatus(code, unfit.Reason)
	}
	return nil
}

// PreScore skips Score for a pod without shares.
func (p *Plugin) PreScore(_ context.Context, state fwk.CycleState, _ *v1.Pod,
	_ []fwk.NodeInfo) *fwk.Status {
	if cycleOf(state) == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score is the node strategy's score of the pod's fit (placement.NodeScore 0..10, scaled to
// 0..MaxNodeScore), at least 1, and 0 where the bind gate would hold the pod now (with
// binpack's 0..10, a nearly empty node scores 0 too, and a tie would send pods to held
// nodes).
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	info fwk.NodeInfo) (int64, *fwk.Status) {
	c := cycleOf(state)
	if c == nil {
		return 0, nil
	}
	placed := p.fit(c, pod, p.withNominated(info, pod)).placed
	if placed == nil {
		return 0, nil
	}
	if p.gate.WouldHold(info.Node().Name, string(pod.UID), sizesOf(placed)) {
		return 0, nil
	}
	score := int64(placement.NodeScore(c.demand.NodePolicy, placed.Utilization)) *
		fwk.MaxNodeScore / 10
	return max(1, score), nil
}

// ScoreExtensions: none (scores are 0..MaxNodeScore already).
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

// Reserve holds the pod's placement on the node until its record is seen.
func (p *Plugin) Reserve(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	nodeName string) *fwk.Status {
	c := cycleOf(state)
	if c == nil {
		return nil
	}
	info, err := p.handle.SnapshotSharedLister().NodeInfos().Get(nodeName)
	if err != nil {
		return fwk.AsStatus(err)
	}
	got := p.fit(c, pod, p.withNominated(info, pod))
	if got.unfit != nil {
		return fwk.NewStatus(fwk.Unschedulable, "the node no longer fits: "+got.unfit.Reason)
	}
	p.mu.Lock()
	p.held[pod.UID] = reservation{nodeName, got.placed}
	p.mu.Unlock()
	return nil
}

// Unreserve lets the pod's placement go, and what the gate held behind it.
func (p *Plugin) Unreserve(_ context.Context, _ fwk.CycleState, pod *v1.Pod, node string) {
	p.mu.Lock()
	delete(p.held, pod.UID)
	p.mu.Unlock()
	p.gate.Forget(node, string(pod.UID), p.let)
}

// Permit is the bind gate: Wait (at most gateWait) while a pod on the node that the kubelet
// has not admitted could be handed the pod's cards.
func (p *Plugin) Permit(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	nodeName string) (*fwk.Status, time.Duration) {
	if cycleOf(state) == nil {
		return nil, 0
	}
	r, ok := p.reservation(pod.UID)
	if !ok {
		return fwk.NewStatus(fwk.Error, "egpu: no reservation for the pod"), 0
	}
	if !p.gate.Enter(nodeName, string(pod.UID), sizesOf(r.placement)) {
		return nil, 0
	}
	klog.InfoS("egpu bind gate held the pod", "pod", klog.KObj(pod), "node", nodeName,
		"holds", p.holds.Add(1))
	gateHeld.Inc()
	return fwk.NewStatus(fwk.Wait, "a pod awaiting admission on the node holds other cards"),
		gateWait
}

// Bind posts one Binding that carries the pod's egpu.io/allocation record.
func (p *Plugin) Bind(ctx context.Context, state fwk.CycleState, pod *v1.Pod,
	nodeName string) *fwk.Status {
	c := cycleOf(state)
	if c == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	r, ok := p.reservation(pod.UID)
	if !ok {
		return fwk.NewStatus(fwk.Error, "egpu: no reservation for the pod")
	}
	text, err := allocationRecord(nodeName, c.demand, r.placement).Encode()
	if err != nil {
		return fwk.AsStatus(err)
	}
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			Annotations: map[string]string{annAllocation: text}},
		Target: v1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	pods := p.handle.ClientSet().CoreV1().Pods(pod.Namespace)
	postCtx, cancelPost := context.WithTimeout(ctx, bindTimeout)
	err = pods.Bind(postCtx, binding, metav1.CreateOptions{})
	cancelPost()
	if err == nil {
		return nil
	}
	// An error may come after the API server wrote the Binding (a timeout, a reset): read the
	// pod back, so that a pod bound there keeps its cards booked (Unreserve would free them
	// until the informer brings the bound pod).
	getCtx, cancelGet := context.WithTimeout(ctx, bindTimeout)
	defer cancelGet()
	if now, getErr := pods.Get(getCtx, pod.Name, metav1.GetOptions{}); getErr == nil &&
		now.UID == pod.UID && now.Spec.NodeName == nodeName {
		klog.InfoS("egpu: the Binding's answer was an error, but the pod is bound",
			"pod", klog.KObj(pod), "node", nodeName, "err", err)
		return nil
	}
	return fwk.AsStatus(fmt.Errorf("binding %s/%s to %s: %w", pod.Namespace, pod.Name,
		nodeName, err))
}

func (p *Plugin) reservation(uid types.UID) (reservation, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.held[uid]
	return r, ok
}

// let lets a pod the gate releases through, if the scheduler lists it as waiting.
func (p *Plugin) let(uid string) bool {
	wp := p.handle.GetWaitingPod(types.UID(uid))
	if wp == nil {
		return false
	}
	wp.Allow(Name)
	return true
}

// nodeState is the node's cards with everything booked there but the pod's own: the pods'
// records, and the reservations of pods not yet seen bound. Kept per NodeInfo generation,
// except for a pod that is itself on the node. own: the pod is not on the node (the state is
// the node's own, whatever pod asks). Caller holds mu.
func (p *Plugin) nodeState(info fwk.NodeInfo, self types.UID) (state placement.NodeState,
	own bool) {
	node := info.Node()
	annotations := annotationsOf(node.Annotations)
	parsed := p.nodes[node.Name]
	if parsed == nil || parsed.annotations != annotations {
		parsed = &parsedNode{annotations, parseNode(node.Name, annotations)}
		p.nodes[node.Name] = parsed
	}
	pods := info.GetPods()
	keep := true
	for _, pi := range pods {
		keep = keep && pi.GetPod().UID != self
	}
	before, known := p.states[node.Name]
	if keep && known && before.parsed == parsed && before.generation == info.GetGeneration() {
		return before.state, true
	}
	records := map[types.UID]map[string]placement.CardBooking{}
	var bookings []map[string]placement.CardBooking
	var nominated []*v1.Pod
	for _, pi := range pods {
		pod := pi.GetPod()
		if pod.UID == self {
			continue
		}
		if b, ok := recordBookings(pod, before.records); ok {
			records[pod.UID] = b
			bookings = append(bookings, b)
			delete(p.held, pod.UID) // its record says what the reservation did
		} else if r, ok := p.held[pod.UID]; ok && r.node == node.Name {
			bookings = append(bookings, r.placement.Bookings)
		} else if pod.Spec.NodeName == "" {
			nominated = append(nominated, pod)
		}
	}
	state = booked(parsed.state, bookings)
	if len(nominated) > 0 {
		state = p.bookNominated(state, parsed.state, bookings, nominated)
	}
	if keep {
		p.states[node.Name] = bookedNode{info.GetGeneration(), parsed, state, records}
	}
	return state, keep
}

// withNominated is info with the pods nominated to its node that Filter's first pass adds for
// pod (those of its priority or above, itself left out: addGENominatedPods in kube-scheduler's
// framework runtime), so that Score and Reserve, which get the node without them, choose
// cards the way Filter fitted them: beside the preemptor's, not on the cards its victims
// freed. The node itself when none is nominated there.
func (p *Plugin) withNominated(info fwk.NodeInfo, pod *v1.Pod) fwk.NodeInfo {
	var add []fwk.PodInfo
	for _, pi := range p.handle.NominatedPodsForNode(info.Node().Name) {
		if other := pi.GetPod(); other.UID != pod.UID && corev1helpers.PodPriority(other) >= corev1helpers.PodPriority(pod) {
			add = append(add, pi)
		}
	}
	if len(add) == 0 {
		return info
	}
	out := info.Snapshot()
	for _, pi := range add {
		out.AddPodInfo(pi)
	}
	return out
}

// bookNominated books the shares of pods nominated to the node, which the scheduler adds to a
// copy of the node for a pod of lower or equal priority (RunFilterPluginsWithNominatedPods):
// a preemptor not yet bound has no record and no reservation, yet the cards its victims free
// are its. Each is fitted on the state as it stands, in order; one that does not fit books
// nothing (the scheduler fits it again in its own cycle). Without this, a pod of lower
// priority takes the freed cards and the preemptor preempts again.
func (p *Plugin) bookNominated(state, base placement.NodeState,
	bookings []map[string]placement.CardBooking, nominated []*v1.Pod) placement.NodeState {
	now := float64(p.now().Unix())
	for _, pod := range nominated {
		d, err := readDemand(pod, p.settings)
		if err != nil || d == nil {
			continue
		}
		if placed, _ := placement.Fit(state, d.PodDemand, p.settings.limits, now); placed != nil {
			bookings = append(bookings, placed.Bookings)
			state = booked(base, bookings)
		}
	}
	return state
}

// recordBookings is what the pod's egpu.io/allocation record books per card (known: the
// bookings decoded before, by pod); false when it has none. A record that does not decode
// books nothing and is logged, as does a finished pod's, or a record on a pod that asks for
// no share (scheduler/state.py pod_booking).
func recordBookings(pod *v1.Pod, known map[types.UID]map[string]placement.CardBooking) (
	map[string]placement.CardBooking, bool) {
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return nil, true
	}
	if got, ok := known[pod.UID]; ok {
		return got, true
	}
	text, ok := pod.Annotations[annAllocation]
	if !ok {
		return nil, false
	}
	if !asksForShares(pod) {
		return nil, true
	}
	a, err := records.DecodeAllocation(text)
	if err != nil {
		klog.ErrorS(err, "egpu: unreadable allocation record", "pod", klog.KObj(pod))
		return nil, true
	}
	return placement.BookingsOf(a), true
}

// forgetNode drops what the plugin keeps of a deleted node.
func (p *Plugin) forgetNode(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if node, ok := o.(*v1.Node); ok {
		p.mu.Lock()
		delete(p.nodes, node.Name)
		delete(p.states, node.Name)
		delete(p.shapes, node.Name)
		p.mu.Unlock()
	}
}

// observe keeps the gate and the record cache in step with the pods: a pod gone drops its
// entries; a pod admitted (or rejected) by its kubelet leaves the gate; a pod seen bound with
// a record and not admitted counts at the gate.
func (p *Plugin) observe(o any, deleted bool) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	pod, ok := o.(*v1.Pod)
	if !ok {
		return
	}
	if deleted {
		p.mu.Lock()
		delete(p.held, pod.UID)
		p.mu.Unlock()
	}
	if deleted || admitted(pod) {
		p.gate.Done(string(pod.UID), p.let)
		return
	}
	text, ok := pod.Annotations[annAllocation]
	if pod.Spec.NodeName == "" || !ok {
		return
	}
	if a, err := records.DecodeAllocation(text); err == nil {
		p.gate.Bound(pod.Spec.NodeName, string(pod.UID), recordSizes(a))
	}
}

// admitted is egpu.kube.KubePod.admitted: the kubelet wrote what it writes only after
// admission (or a rejection).
func admitted(pod *v1.Pod) bool {
	s := pod.Status
	return s.StartTime != nil || (s.Phase != "" && s.Phase != v1.PodPending) ||
		len(s.ContainerStatuses) > 0 || len(s.InitContainerStatuses) > 0
}
