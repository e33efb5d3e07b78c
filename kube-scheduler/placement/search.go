package placement

import (
	"fmt"
	"math"
	"sort"
)

// The search (scheduler/placement/search.py): fit all of a pod's shares on one node's cards.
// A container asking for n cards gets n distinct cards; containers of one pod may share a
// card (their shares add up there by bookCard). App and sidecar containers go first (most
// cards first), then init containers, preferring cards the pod already uses; each
// container's cards are ordered by the card strategy and combinations tried depth first with
// backtracking, at most searchBudget per node.

const (
	searchBudget    = 2000 // combinations tried per node before giving up
	initReuseBudget = 200  // of those, first spent looking for inits on the pod's own cards
)

// Policy is a placement strategy, for the cards of a node (egpu.io/gpu-policy) and for the
// nodes (egpu.io/node-policy): Binpack or Spread (scheduler/strategies).
type Policy string

const (
	Binpack Policy = "binpack"
	Spread  Policy = "spread"
)

// ParsePolicy is the Policy named text; an error names the value and what is allowed.
func ParsePolicy(text string) (Policy, error) {
	switch Policy(text) {
	case Binpack, Spread:
		return Policy(text), nil
	}
	return "", fmt.Errorf("placement policy %q; allowed: binpack, spread", text)
}

// cardKey orders the cards that take a share under a card strategy: binpack the fullest
// first, spread the emptiest first, ties by lowest index.
func cardKey(policy Policy, fullness float64, index int) []float64 {
	if policy == Spread {
		return []float64{fullness, float64(index)}
	}
	return []float64{-fullness, float64(index)}
}

// NodeScore is a node's score 0..10 under the node strategy: binpack round(10 x
// utilization), spread 10 minus that (Python's round: half to even), within 0..10 whatever
// the utilization.
func NodeScore(policy Policy, utilization float64) int {
	r := int(math.RoundToEven(10 * utilization))
	if policy == Spread {
		r = 10 - r
	}
	return max(0, min(10, r))
}

func keyLess(a, b []float64) bool {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

type fitCard struct {
	key   []float64
	pos   int
	added CardBooking
}

type pick struct{ pos, mib int }

type search struct {
	cards           []CardState
	demand          PodDemand
	bounds          bounds
	memCaps         []int
	initsOnOwnCards bool
	budget          int
	entries         [][]entry
	use             []CardBooking
	chosen          map[string][]pick
	tries           int
	failure         string
	failureDepth    int
}

func newSearch(cards []CardState, d PodDemand, l Limits, initsOnOwnCards bool,
	budget int) *search {
	s := &search{cards: cards, demand: d, bounds: boundsOf(d, l), initsOnOwnCards: initsOnOwnCards,
		budget: budget, entries: make([][]entry, len(cards)),
		use: make([]CardBooking, len(cards)), chosen: map[string][]pick{}, failureDepth: -1}
	for _, c := range cards {
		s.memCaps = append(s.memCaps, s.bounds.memory(c.CapacityMiB))
	}
	return s
}

// try is the pod's new booking on card pos with c added, or false and why not.
func (s *search) try(pos int, c ContainerDemand) (CardBooking, string, bool) {
	card := s.cards[pos]
	mib := c.Share.MemoryOn(card.CapacityMiB)
	entries := append(append([]entry(nil), s.entries[pos]...),
		entry{c.Order, c.Kind, mib, c.Share.Cores})
	sortStable(entries, func(a, b entry) bool { return a.order < b.order })
	added := bookCard(entries)
	held, memCap := s.use[pos], s.memCaps[pos]
	if which := refused(card, s.bounds, memCap, held, added); which != none {
		return CardBooking{}, reason(which, card, s.bounds, memCap, held, added, mib,
			c.Share.Cores), false
	}
	return added, "", true
}

// takesAll: card pos also has room for all of group (summed) on top.
func (s *search) takesAll(pos int, group []ContainerDemand) bool {
	card, use := s.cards[pos], s.use[pos]
	mib, cores := 0, 0
	for _, x := range group {
		mib += x.Share.MemoryOn(card.CapacityMiB)
		cores += x.Share.Cores
	}
	return card.BookedMiB+use.MemoryMiB+mib <= s.memCaps[pos] &&
		(cores == 0 || card.BookedCores+use.Cores+cores <= s.bounds.cores) &&
		card.UsedSlots+use.Slots+len(group) <= s.bounds.slots
}

func (s *search) fail(depth int, text string) {
	if depth > s.failureDepth {
		s.failureDepth, s.failure = depth, text
	}
}

func boolKey(b bool) float64 {
	if b {
		return 0
	}
	return 1
}

// fits is the cards that take c now, with their sort keys, and why each other one does not.
func (s *search) fits(depth int, c ContainerDemand) ([]fitCard, []string) {
	var together []ContainerDemand
	if s.demand.GPUPolicy != Spread { // binpack keeps a pod's one-card shares together
		for _, x := range s.demand.Containers[depth:] {
			if x.Kind != Init && x.Share.GPUs == 1 {
				together = append(together, x)
			}
		}
	}
	var fits []fitCard
	var reasons []string
	for pos, card := range s.cards {
		if s.initsOnOwnCards && c.Kind == Init && s.use[pos].Slots == 0 {
			continue
		}
		added, why, ok := s.try(pos, c)
		if !ok {
			reasons = append(reasons, why)
			continue
		}
		fullness := float64(card.BookedMiB+s.use[pos].MemoryMiB) / float64(card.CapacityMiB)
		key := cardKey(s.demand.GPUPolicy, fullness, card.Index)
		if c.Kind == Init { // reuse the pod's own cards first
			key = append([]float64{boolKey(s.use[pos].Slots > 0)}, key...)
		} else if len(together) > 0 { // a card that takes them all first, then the pod's own
			key = append([]float64{boolKey(s.takesAll(pos, together)),
				boolKey(s.use[pos].Slots > 0)}, key...)
		}
		fits = append(fits, fitCard{key, pos, added})
	}
	return fits, reasons
}

// kubeletAgrees: the kubelet, reusing init containers' slots, hands every container the
// cards chosen (reuseConflict); the reason is kept otherwise.
func (s *search) kubeletAgrees() bool {
	ordered := append([]ContainerDemand(nil), s.demand.Containers...)
	sortStable(ordered, func(a, b ContainerDemand) bool { return a.Order < b.Order })
	steps := make([]reuseStep, 0, len(ordered))
	for _, c := range ordered {
		cards := map[int]bool{}
		for _, p := range s.chosen[c.Name] {
			cards[p.pos] = true
		}
		steps = append(steps, reuseStep{c.Name, c.Kind == Init, cards})
	}
	why := reuseConflict(steps)
	if why == "" {
		return true
	}
	s.fail(len(ordered), "no placement that the kubelet would hand out as chosen: "+why)
	return false
}

// run places containers[depth:]; true when all are placed (results in chosen).
func (s *search) run(depth int) bool {
	containers := s.demand.Containers
	if depth == len(containers) {
		return s.kubeletAgrees()
	}
	c := containers[depth]
	fits, reasons := s.fits(depth, c)
	if len(fits) < c.Share.GPUs {
		s.fail(depth, shortOfCards(c, len(fits), reasons, len(reasons), depth > 0))
		return false
	}
	sort.SliceStable(fits, func(i, j int) bool { return keyLess(fits[i].key, fits[j].key) })
	placed, stop := false, false
	combinations(len(fits), c.Share.GPUs, func(combo []int) bool {
		s.tries++
		if s.tries > s.budget {
			s.fail(len(containers), fmt.Sprintf("no placement found within %d tries", s.budget))
			stop = true
			return false
		}
		saved := make([]CardBooking, len(combo))
		picks := make([]pick, 0, len(combo))
		for i, k := range combo {
			f := fits[k]
			saved[i] = s.use[f.pos]
			mib := c.Share.MemoryOn(s.cards[f.pos].CapacityMiB)
			s.entries[f.pos] = append(s.entries[f.pos], entry{c.Order, c.Kind, mib, c.Share.Cores})
			s.use[f.pos] = f.added
			picks = append(picks, pick{f.pos, mib})
		}
		s.chosen[c.Name] = picks
		if s.run(depth + 1) {
			placed = true
			return false
		}
		if s.tries > s.budget {
			stop = true
		}
		for i, k := range combo {
			f := fits[k]
			s.entries[f.pos] = s.entries[f.pos][:len(s.entries[f.pos])-1]
			s.use[f.pos] = saved[i]
		}
		delete(s.chosen, c.Name)
		return !stop
	})
	return placed
}

// combinations calls yield with each k-combination of 0..n-1 in lexicographic order (as
// Python's itertools.combinations) until yield returns false.
func combinations(n, k int, yield func([]int) bool) {
	if k > n {
		return
	}
	idx := make([]int, k)
	for i := range idx {
		idx[i] = i
	}
	for {
		if !yield(append([]int(nil), idx...)) {
			return
		}
		i := k - 1
		for i >= 0 && idx[i] == n-k+i {
			i--
		}
		if i < 0 {
			return
		}
		idx[i]++
		for j := i + 1; j < k; j++ {
			idx[j] = idx[j-1] + 1
		}
	}
}

// searchCards places the pod on these cards. A pod with init and steady containers is first
// placed with its inits on cards its steady containers use (an init there costs only what it
// asks beyond them: FC-07's max rule); only when there is none within initReuseBudget tries
// may an init take a card of its own, which books the pod a second card for its whole life.
func searchCards(cards []CardState, d PodDemand, l Limits) *search {
	hasInit, hasSteady := false, false
	for _, c := range d.Containers {
		if c.Kind == Init {
			hasInit = true
		} else {
			hasSteady = true
		}
	}
	if hasInit && hasSteady {
		first := newSearch(cards, d, l, true, initReuseBudget)
		if first.run(0) {
			return first
		}
	}
	found := newSearch(cards, d, l, false, searchBudget)
	found.run(0)
	return found
}

// Fit fits the pod's demand on node at now (unix seconds): a Placement, or an Unfit with a
// reason a user can act on. Never panics on odd data (a node without capacity places at
// utilization 1).
func Fit(node NodeState, d PodDemand, l Limits, now float64) (*Placement, *Unfit) {
	if stale := staleReason(node, now, l); stale != "" {
		return nil, &Unfit{node.Name, stale, true}
	}
	var allowed []CardState
	for _, c := range node.Cards {
		if cardAllowed(c, d) {
			allowed = append(allowed, c)
		}
	}
	if len(allowed) == 0 {
		return nil, &Unfit{node.Name, filterReason(node, d), true}
	}
	found := searchCards(allowed, d, l)
	if len(found.chosen) != len(d.Containers) {
		emptied := make([]CardState, len(allowed))
		for i, c := range allowed {
			emptied[i] = c.emptied()
		}
		unresolvable := len(searchCards(emptied, d, l).chosen) != len(d.Containers)
		return nil, &Unfit{node.Name, found.failure, unresolvable}
	}
	ordered := append([]ContainerDemand(nil), d.Containers...)
	sortStable(ordered, func(a, b ContainerDemand) bool { return a.Order < b.Order })
	p := &Placement{Node: node.Name, Bookings: map[string]CardBooking{}}
	for _, c := range ordered {
		a := ContainerAllocation{Name: c.Name, Init: c.Kind != App}
		for _, pk := range found.chosen[c.Name] {
			card := allowed[pk.pos]
			a.Cards = append(a.Cards, CardShare{card.UUID, card.Index, pk.mib, c.Share.Cores})
		}
		p.Containers = append(p.Containers, a)
	}
	capacityMiB, bookedMiB := node.capacity()
	for pos, use := range found.use {
		if use.Slots > 0 {
			p.Bookings[allowed[pos].UUID] = use
		}
	}
	for _, use := range p.Bookings { // per UUID, as the record books them
		bookedMiB += use.MemoryMiB
	}
	p.Utilization = 1.0
	if capacityMiB > 0 {
		p.Utilization = float64(bookedMiB) / float64(capacityMiB)
	}
	return p, nil
}
