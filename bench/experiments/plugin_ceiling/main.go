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
// (multi-card shares, init containers, model and UUID filters, the bind gate) is
// what makes the figure a ceiling, not a port.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
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
}

func newPlugin(_ context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	return &plugin{handle: h, inv: map[string]parsedInventory{},
		booked: map[types.UID][]booking{}, held: map[types.UID]booking{}}, nil
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
func (p *plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod,
	info fwk.NodeInfo) (int64, *fwk.Status) {
	r, err := read(state)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	p.mu.Lock()
	_, utilization, ok := p.fit(r, info)
	p.mu.Unlock()
	if !ok {
		return 0, nil
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

func (p *plugin) Unreserve(_ context.Context, _ fwk.CycleState, pod *v1.Pod, _ string) {
	p.mu.Lock()
	delete(p.held, pod.UID)
	p.mu.Unlock()
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
