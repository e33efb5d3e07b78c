// Package gate is egpu's bind gate (docs/node.md, "One binding of pod to cards": the rule,
// and the bookkeeping of pods awaiting admission), with no Kubernetes types.
//
// The kubelet's device plugin calls name slots, never the pod. The node agent answers them
// with the cards of the first pending container of the asked size, which is the container
// being admitted whenever the pods awaiting admission on a node agree, for each slot count,
// on one card set (or one pod alone has containers of that size). So a share pod is let
// through to its Binding only when no pod on its node that the kubelet has not admitted yet
// conflicts with it, and waits (held) until then.
package gate

import (
	"sort"
	"strings"
	"sync"
)

// Sizes is a pod's card sets per slot count: for each number of cards a container asks for,
// the sets (UUIDs sorted, joined by ",") its containers of that size use. What
// GetPreferredAllocation and Allocate can tell a pod by.
type Sizes map[int]map[string]bool

// SizesOf is the Sizes of a pod whose containers with a share use these cards (one UUID list
// per container).
func SizesOf(containers [][]string) Sizes {
	out := Sizes{}
	for _, cards := range containers {
		uuids := append([]string(nil), cards...)
		sort.Strings(uuids)
		if out[len(uuids)] == nil {
			out[len(uuids)] = map[string]bool{}
		}
		out[len(uuids)][strings.Join(uuids, ",")] = true
	}
	return out
}

// Conflicts is the gate's rule for two pods on one node: for some slot count, their
// containers of that size use more than one card set between them.
func (s Sizes) Conflicts(other Sizes) bool {
	for size, sets := range s {
		seen, ok := other[size]
		if !ok {
			continue
		}
		union := len(seen)
		for set := range sets {
			if !seen[set] {
				union++
			}
		}
		if union > 1 {
			return true
		}
	}
	return false
}

// Gate is the state of the bind gate on every node: the pods bound or let through there
// that the kubelet has not admitted yet, and the pods held. Safe for concurrent use. Pods
// are named by UID, nodes by name.
type Gate struct {
	mu         sync.Mutex
	unadmitted map[string]map[string]Sizes // node -> pods not admitted yet
	held       map[string]map[string]Sizes // node -> pods waiting to be let through
}

// New is a gate with no pods.
func New() *Gate {
	return &Gate{unadmitted: map[string]map[string]Sizes{}, held: map[string]map[string]Sizes{}}
}

func put(m map[string]map[string]Sizes, node, uid string, s Sizes) {
	if m[node] == nil {
		m[node] = map[string]Sizes{}
	}
	m[node][uid] = s
}

// conflict: a pod of sizes s, uid, bound to node now could be handed another pod's cards
// there. Caller holds mu.
func (g *Gate) conflict(node, uid string, s Sizes) bool {
	for other, theirs := range g.unadmitted[node] {
		if other != uid && s.Conflicts(theirs) {
			return true
		}
	}
	return false
}

// WouldHold says whether Enter would hold the pod on node now (a score steers pods off such
// nodes).
func (g *Gate) WouldHold(node, uid string, s Sizes) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.conflict(node, uid, s)
}

// Enter is the pod's turn at the gate: false lets it through (it now counts as not admitted
// on node), true holds it until Release lets it through.
func (g *Gate) Enter(node, uid string, s Sizes) (held bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conflict(node, uid, s) {
		put(g.held, node, uid, s)
		return true
	}
	put(g.unadmitted, node, uid, s)
	return false
}

// Bound records a pod seen bound to node and not admitted (it was bound before this gate
// knew it: a restart, or another scheduler). A pod the gate knows keeps its entry.
func (g *Gate) Bound(node, uid string, s Sizes) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, known := g.unadmitted[node][uid]; !known {
		put(g.unadmitted, node, uid, s)
	}
}

// Done drops a pod the kubelet admitted (or rejected), or that is gone, on every node, and
// lets through what it held: let is called, under the gate's lock, for each held pod that no
// longer conflicts, and says whether the pod was let through (false: not waiting yet, or
// gone; it stays held).
func (g *Gate) Done(uid string, let func(uid string) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for node, pods := range g.unadmitted {
		if _, was := pods[uid]; was {
			delete(pods, uid)
			g.release(node, let) // drops the node's maps once empty
		}
	}
}

// Forget drops a pod whose binding was given up (Unreserve) from node, held or not, and lets
// through what it held there (as Done).
func (g *Gate) Forget(node, uid string, let func(uid string) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.held[node], uid)
	if len(g.held[node]) == 0 {
		delete(g.held, node)
	}
	if _, was := g.unadmitted[node][uid]; was {
		delete(g.unadmitted[node], uid)
		g.release(node, let)
	}
}

// Sweep offers every held pod its turn again (as Done). It catches a release that came
// between a pod's hold and the moment the scheduler lists it as waiting.
func (g *Gate) Sweep(let func(uid string) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for node, pods := range g.held {
		if len(pods) > 0 {
			g.release(node, let)
		}
	}
}

// Nodes is the number of nodes the gate keeps entries for (held or not admitted).
func (g *Gate) Nodes() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	nodes := map[string]bool{}
	for node := range g.held {
		nodes[node] = true
	}
	for node := range g.unadmitted {
		nodes[node] = true
	}
	return len(nodes)
}

// Held is the number of pods held now.
func (g *Gate) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, pods := range g.held {
		n += len(pods)
	}
	return n
}

// release lets through, one at a time in UID order, each pod held on node that no longer
// conflicts: each one let through counts for the next. Caller holds mu.
func (g *Gate) release(node string, let func(uid string) bool) {
	uids := make([]string, 0, len(g.held[node]))
	for uid := range g.held[node] {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	for _, uid := range uids {
		s := g.held[node][uid]
		if g.conflict(node, uid, s) || !let(uid) {
			continue
		}
		delete(g.held[node], uid)
		put(g.unadmitted, node, uid, s)
	}
	if len(g.held[node]) == 0 {
		delete(g.held, node)
	}
	if len(g.unadmitted[node]) == 0 {
		delete(g.unadmitted, node)
	}
}
