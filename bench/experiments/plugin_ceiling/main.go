// Experiment (issue 24), not shipped: how fast kube-scheduler v1.37.2 binds egpu extender-path
// shares when the card placement runs inside it as a plugin instead of over the extender's
// HTTPS verbs. Built as a kube-scheduler with one extra plugin, EgpuCardFit, run by
// bench/experiments/plugin_ceiling/run.py in place of the extender.
//
// EgpuCardFit places single-card shares only (egpu.io/gpu 1, egpu.io/gpu-memory in MiB,
// egpu.io/gpu-cores in %), first fit on the fullest card that fits, at most sharesPerCard
// shares a card. It reads the node's egpu.io/inventory (parsed once per annotation text) and
// the node's pods' egpu.io/allocation (parsed once per pod UID), scores a node as binpack
// does (its cards' booked MiB over their capacity once the share is placed), keeps its own reservations
// for pods assumed but not yet seen bound, and binds with one Binding that carries the
// pod's egpu.io/allocation, as the extender does. What it leaves out of the extender's rule
// (multi-card shares, init containers, model and UUID filters) is what makes the figure a
// ceiling, not a port.
//
// With EGPU_BIND_GATE=1 it also runs the extender's bind gate (scheduler/placement/kubelet.py,
// admission_conflict) as a Permit wait: a share pod whose card differs from the card of a pod
// on the same node that its kubelet has not admitted yet (bound, or allowed and binding)
// waits, at most gateWait, until no such pod is left; pod events from the scheduler's own
// informer wake the node's waiting pods, which are let through one at a time.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
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
)

const (
	name          = "EgpuCardFit"
	annInventory  = "egpu.io/inventory"
	annAllocation = "egpu.io/allocation"
	resMemory     = "egpu.io/gpu-memory"
	resCores      = "egpu.io/gpu-cores"
	sharesPerCard = 4   // bench/scheduling.py's SHARES
	coresPerCard  = 100 // %
	stateKey      = fwk.StateKey(name)
	gateWait      = 8 * time.Second // the extender's BIND_GATE_WAIT_S
	sweepEvery    = 100 * time.Millisecond
)

type card struct {
	UUID      string `json:"uuid"`
	Index     int    `json:"index"`
	MemoryMiB int64  `json:"memory_mib"`
	Healthy   bool   `json:"healthy"`
}

type inventory struct {
	Cards []card `json:"cards"`
}

type cardShare struct {
	UUID      string `json:"uuid"`
	Index     int    `json:"index"`
	MemoryMiB int64  `json:"memory_mib"`
	Cores     int64  `json:"cores"`
}

type containerAllocation struct {
	Name  string      `json:"name"`
	Kind  string      `json:"kind"`
	Init  bool        `json:"init"`
	Cards []cardShare `json:"cards"`
}

type allocation struct {
	Version                int                   `json:"version"`
	Node                   string                `json:"node"`
	Priority               string                `json:"priority"`
	ComputePolicy          string                `json:"compute_policy"`
	MemoryOversubscription bool                  `json:"memory_oversubscription"`
	Containers             []containerAllocation `json:"containers"`
}

type request struct {
	container string
	memoryMiB int64
	cores     int64
}

func (r *request) Clone() fwk.StateData { return r }

type parsedInventory struct {
	raw   string
	cards []card
}

type booking struct {
	uuid      string
	index     int
	memoryMiB int64
	cores     int64
}

type plugin struct {
	handle fwk.Handle
	mu     sync.Mutex
	inv    map[string]parsedInventory // node -> its inventory, by annotation text
	booked map[types.UID][]booking    // pod -> its cards, from its annotation
	held   map[types.UID]booking      // pod -> the card reserved, until bound

	gate        bool
	gateScore   bool
	gateMu      sync.Mutex
	unadmitted  map[string]map[types.UID]string // node -> pod -> card UUID, not admitted yet
	waiting     map[string]map[types.UID]string // node -> pod -> card UUID, held at Permit
	holds, lets int                             // pods held at the gate, and let through
}

func newPlugin(_ context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	p := &plugin{handle: h, inv: map[string]parsedInventory{},
		booked: map[types.UID][]booking{}, held: map[types.UID]booking{},
		gate:       os.Getenv("EGPU_BIND_GATE") == "1",
		gateScore:  os.Getenv("EGPU_GATE_SCORE") == "1",
		unadmitted: map[string]map[types.UID]string{},
		waiting:    map[string]map[types.UID]string{}}
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
	if deleted && pod.Spec.NodeName == "" { // a final state unknown may predate its binding
		for node, pods := range p.unadmitted {
			if _, was := pods[pod.UID]; was {
				delete(pods, pod.UID)
				p.release(node)
			}
		}
		return
	}
	if pod.Spec.NodeName == "" {
		return
	}
	node := pod.Spec.NodeName
	if deleted || admitted(pod) {
		if _, was := p.unadmitted[node][pod.UID]; was {
			delete(p.unadmitted[node], pod.UID)
			p.release(node)
		}
		return
	}
	if _, known := p.unadmitted[node][pod.UID]; known {
		return
	}
	if bs := p.bookingsOfUnlocked(pod); len(bs) > 0 {
		p.mark(p.unadmitted, node, pod.UID, bs[0].uuid)
	}
}

func (p *plugin) bookingsOfUnlocked(pod *v1.Pod) []booking {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bookingsOf(pod)
}

func (p *plugin) mark(m map[string]map[types.UID]string, node string, uid types.UID,
	uuid string) {
	if m[node] == nil {
		m[node] = map[types.UID]string{}
	}
	m[node][uid] = uuid
}

// conflict: a pod on node that its kubelet has not admitted holds another card (all shares
// here are single-card, so any other card is a share of the same size). Caller holds gateMu.
func (p *plugin) conflict(node string, uid types.UID, uuid string) bool {
	for other, card := range p.unadmitted[node] {
		if other != uid && card != uuid {
			return true
		}
	}
	return false
}

// release lets through each pod waiting on node that no longer conflicts, one at a time (each
// one let through counts for the next). Caller holds gateMu.
func (p *plugin) release(node string) {
	for uid, uuid := range p.waiting[node] {
		if p.conflict(node, uid, uuid) {
			continue
		}
		wp := p.handle.GetWaitingPod(uid)
		if wp == nil {
			continue // not in the framework's wait yet (Permit returns first), or gone
		}
		delete(p.waiting[node], uid)
		p.mark(p.unadmitted, node, uid, uuid)
		p.lets++
		wp.Allow(name)
	}
}

func (p *plugin) Permit(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	nodeName string) (*fwk.Status, time.Duration) {
	if !p.gate {
		return nil, 0
	}
	if _, err := read(state); err != nil {
		return nil, 0 // not a share pod
	}
	p.mu.Lock()
	uuid := p.held[pod.UID].uuid
	p.mu.Unlock()
	p.gateMu.Lock()
	defer p.gateMu.Unlock()
	if p.conflict(nodeName, pod.UID, uuid) {
		p.mark(p.waiting, nodeName, pod.UID, uuid)
		p.holds++
		if p.holds%50 == 1 {
			klog.InfoS("egpu bind gate", "holds", p.holds, "letThrough", p.lets)
		}
		return fwk.NewStatus(fwk.Wait, "a pod awaiting admission holds another card"), gateWait
	}
	p.mark(p.unadmitted, nodeName, pod.UID, uuid)
	return nil, 0
}

func (p *plugin) Name() string { return name }

func quantity(c *v1.Container, res v1.ResourceName) (int64, bool) {
	q, ok := c.Resources.Limits[res]
	if !ok {
		return 0, false
	}
	return q.Value(), true
}

func (p *plugin) PreFilter(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	_ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		mem, ok := quantity(c, resMemory)
		if !ok {
			continue
		}
		cores, _ := quantity(c, resCores)
		state.Write(stateKey, &request{container: c.Name, memoryMiB: mem, cores: cores})
		return nil, nil
	}
	return nil, fwk.NewStatus(fwk.Skip)
}

func (p *plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

func (p *plugin) cardsOf(node *v1.Node) []card {
	raw := node.Annotations[annInventory]
	if got, ok := p.inv[node.Name]; ok && got.raw == raw {
		return got.cards
	}
	var inv inventory
	if err := json.Unmarshal([]byte(raw), &inv); err != nil {
		inv.Cards = nil
	}
	p.inv[node.Name] = parsedInventory{raw: raw, cards: inv.Cards}
	return inv.Cards
}

func (p *plugin) bookingsOf(pod *v1.Pod) []booking {
	if got, ok := p.booked[pod.UID]; ok {
		return got
	}
	raw, ok := pod.Annotations[annAllocation]
	if !ok {
		return nil
	}
	var a allocation
	var out []booking
	if json.Unmarshal([]byte(raw), &a) == nil {
		for _, c := range a.Containers {
			for _, s := range c.Cards {
				out = append(out, booking{uuid: s.UUID, memoryMiB: s.MemoryMiB, cores: s.Cores})
			}
		}
	}
	p.booked[pod.UID] = out
	return out
}

type used struct {
	memoryMiB, cores, shares int64
}

// fit is the card to book for r on the node (false when none fits) and the node's healthy
// cards' booked MiB over their capacity once it is booked (binpack's node utilization,
// scheduler/strategies). Caller holds p.mu.
func (p *plugin) fit(r *request, info fwk.NodeInfo) (card, float64, bool) {
	cards := p.cardsOf(info.Node())
	use := make(map[string]*used, len(cards))
	for _, c := range cards {
		use[c.UUID] = &used{}
	}
	add := func(b booking) {
		if u, ok := use[b.uuid]; ok {
			u.memoryMiB += b.memoryMiB
			u.cores += b.cores
			u.shares++
		}
	}
	for _, pi := range info.GetPods() {
		pod := pi.GetPod()
		if bs := p.bookingsOf(pod); bs != nil {
			for _, b := range bs {
				add(b)
			}
			delete(p.held, pod.UID) // its annotation now says what the reservation did
		} else if b, ok := p.held[pod.UID]; ok {
			add(b)
		}
	}
	best, found := card{}, false
	var bestFree, bookedMiB, capacityMiB int64
	for _, c := range cards {
		u := use[c.UUID]
		if c.Healthy {
			bookedMiB += u.memoryMiB
			capacityMiB += c.MemoryMiB
		}
		free := c.MemoryMiB - u.memoryMiB
		if !c.Healthy || free < r.memoryMiB || coresPerCard-u.cores < r.cores ||
			u.shares >= sharesPerCard {
			continue
		}
		if !found || free < bestFree {
			best, bestFree, found = c, free, true
		}
	}
	if !found || capacityMiB == 0 {
		return best, 0, found
	}
	return best, float64(bookedMiB+r.memoryMiB) / float64(capacityMiB), found
}

func (p *plugin) Filter(_ context.Context, state fwk.CycleState, _ *v1.Pod,
	info fwk.NodeInfo) *fwk.Status {
	r, err := read(state)
	if err != nil {
		return fwk.AsStatus(err)
	}
	p.mu.Lock()
	_, _, ok := p.fit(r, info)
	p.mu.Unlock()
	if !ok {
		return fwk.NewStatus(fwk.Unschedulable, "no card has room for the share")
	}
	return nil
}

// Score is binpack's node score: 0 for an empty node, MaxNodeScore for a full one.
// With EGPU_GATE_SCORE=1, a node where the gate would hold the pod scores 0.
func (p *plugin) Score(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	info fwk.NodeInfo) (int64, *fwk.Status) {
	r, err := read(state)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	p.mu.Lock()
	c, utilization, ok := p.fit(r, info)
	p.mu.Unlock()
	if !ok {
		return 0, nil
	}
	if p.gateScore {
		p.gateMu.Lock()
		held := p.conflict(info.Node().Name, pod.UID, c.UUID)
		p.gateMu.Unlock()
		if held {
			return 0, nil
		}
	}
	return int64(min(1, utilization) * float64(fwk.MaxNodeScore)), nil
}

func (p *plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

func read(state fwk.CycleState) (*request, error) {
	d, err := state.Read(stateKey)
	if err != nil {
		return nil, err
	}
	return d.(*request), nil
}

func (p *plugin) Reserve(_ context.Context, state fwk.CycleState, pod *v1.Pod,
	nodeName string) *fwk.Status {
	r, err := read(state)
	if err != nil {
		return fwk.AsStatus(err)
	}
	info, err := p.handle.SnapshotSharedLister().NodeInfos().Get(nodeName)
	if err != nil {
		return fwk.AsStatus(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c, _, ok := p.fit(r, info)
	if !ok {
		return fwk.NewStatus(fwk.Unschedulable, "the card filled before reserve")
	}
	p.held[pod.UID] = booking{uuid: c.UUID, index: c.Index, memoryMiB: r.memoryMiB, cores: r.cores}
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

func (p *plugin) Bind(ctx context.Context, state fwk.CycleState, pod *v1.Pod,
	nodeName string) *fwk.Status {
	r, err := read(state)
	if err != nil {
		return fwk.NewStatus(fwk.Skip)
	}
	p.mu.Lock()
	held := p.held[pod.UID]
	p.mu.Unlock()
	a := allocation{Version: 1, Node: nodeName, Priority: "low", ComputePolicy: "strict",
		Containers: []containerAllocation{{Name: r.container, Kind: "app", Cards: []cardShare{{
			UUID: held.uuid, Index: held.index, MemoryMiB: r.memoryMiB,
			Cores: r.cores}}}}}
	text, err := json.Marshal(a)
	if err != nil {
		return fwk.AsStatus(err)
	}
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			Annotations: map[string]string{annAllocation: string(text)}},
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
