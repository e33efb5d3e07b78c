package placement

import "fmt"

// What the kubelet's device manager (v1.37, devicesToAllocate) does with egpu's slots
// (scheduler/placement/kubelet.py, docs/node.md "One binding of pod to cards"): a regular
// init container's devices go to the pod's reuse pool, and the next container that asks for
// egpu.io/gpu takes the pool's devices first without asking the plugin, all of them when it
// needs as many or more, an arbitrary subset when it needs fewer; a sidecar or app container
// empties the pool again.

// reuseStep is one container with a share, in the kubelet's order: its name, whether it is a
// regular init container, and its cards.
type reuseStep struct {
	name        string
	regularInit bool
	cards       map[int]bool
}

func subset(a, b map[int]bool) bool {
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// reuseConflict says why the kubelet's reuse of init containers' devices would give some
// container other cards than steps say, "" when it gives each exactly its cards.
func reuseConflict(steps []reuseStep) string {
	pool := map[int]bool{}
	before := ""
	for _, s := range steps {
		if len(pool) > len(s.cards) {
			return fmt.Sprintf("container '%s' asks for %d card(s) after init container '%s', "+
				"which had %d: the kubelet hands it an arbitrary %d of those", s.name,
				len(s.cards), before, len(pool), len(s.cards))
		}
		if !subset(pool, s.cards) {
			return fmt.Sprintf("container '%s' would get init container '%s''s card(s) from "+
				"the kubelet, which reuses them for the next container", s.name, before)
		}
		if s.regularInit {
			pool = s.cards
		} else {
			pool = map[int]bool{}
		}
		before = s.name
	}
	return ""
}
