package placement

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// The fit rule (scheduler/placement/rule.py): which cards a pod may use, whether a card takes
// a share, and the one wording of each refusal. The search asks it.

const maxCardsInReason = 4 // refused cards written out in one reason; the rest are counted

// heartbeatFutureSkewS is how far (s) a heartbeat may be ahead of the scheduler's clock and
// still count as fresh: a node whose clock runs ahead would otherwise stay fresh long after
// its agent died.
const heartbeatFutureSkewS = 60.0

type bound int

const (
	none bound = iota
	memoryBound
	coresBound
	slotsBound
)

// bounds is what one card may hold for one pod: memoryRatio (1 unless the pod asked memory
// oversubscription), cores (% of a card) and slots.
type bounds struct {
	memoryRatio float64
	cores       int
	slots       int
}

func boundsOf(d PodDemand, l Limits) bounds {
	ratio := 1.0
	if d.Oversubscribe {
		ratio = l.MemoryRatio
	}
	return bounds{ratio, int(100 * l.CoresRatio), l.SharesPerCard}
}

// memory is the MiB bookable on a card of capacityMiB MiB.
func (b bounds) memory(capacityMiB int) int {
	if b.memoryRatio == 1.0 {
		return capacityMiB
	}
	return int(float64(capacityMiB) * b.memoryRatio)
}

// refused is the bound that refuses the pod's booking on card growing from held to added;
// none when the card takes it. A bound is only checked where the pod adds to it, so a card
// already past a bound (config changed) still takes shares that add nothing there.
func refused(card CardState, b bounds, memCap int, held, added CardBooking) bound {
	if added.MemoryMiB > held.MemoryMiB && card.BookedMiB+added.MemoryMiB > memCap {
		return memoryBound
	}
	if added.Cores > held.Cores && card.BookedCores+added.Cores > b.cores {
		return coresBound
	}
	if added.Slots > held.Slots && card.UsedSlots+added.Slots > b.slots {
		return slotsBound
	}
	return none
}

// reason words a refusal: "card 0 (NVIDIA A10, 23028 MiB): 3028 MiB free, 4000 MiB asked".
func reason(which bound, card CardState, b bounds, memCap int, held, added CardBooking,
	mib, cores int) string {
	switch which {
	case memoryBound:
		if added.MemoryMiB > memCap {
			return fmt.Sprintf("%s: %d MiB asked > %d MiB bookable", card.label(), mib, memCap)
		}
		free := max(0, memCap-card.BookedMiB-held.MemoryMiB)
		return fmt.Sprintf("%s: %d MiB free, %d MiB asked", card.label(), free, mib)
	case coresBound:
		free := max(0, b.cores-card.BookedCores-held.Cores)
		return fmt.Sprintf("%s: %d%% cores free, %d%% asked", card.label(), free, cores)
	}
	return fmt.Sprintf("%s: all %d share slots taken", card.label(), b.slots)
}

// shortOfCards words a container that found fewer cards than it asks: fitted took it,
// refusals refused it (the first reasons written out); beside: placed after other
// containers of the pod.
func shortOfCards(c ContainerDemand, fitted int, reasons []string, refusals int,
	beside bool) string {
	shown := strings.Join(reasons[:min(len(reasons), maxCardsInReason)], "; ")
	if more := refusals - maxCardsInReason; more > 0 {
		shown += fmt.Sprintf("; and %d more cards", more)
	}
	need := "a card"
	if c.Share.GPUs > 1 {
		need = fmt.Sprintf("%d distinct cards", c.Share.GPUs)
	}
	where := ""
	if beside {
		where = " beside the pod's other containers"
	}
	return fmt.Sprintf("container '%s' asks %s: needs %s%s, %d fit (%s)", c.Name,
		c.Share.Describe(), need, where, fitted, shown)
}

var tokenSeparators = regexp.MustCompile(`[ \-_]+`)

// modelMatches: any of names equals the model or one of its tokens (split on ' ', '-', '_'),
// case-insensitive; "A10" matches "NVIDIA A10", never "NVIDIA A100-SXM4-80GB".
func modelMatches(model string, names []string) bool {
	lowered := strings.ToLower(model)
	tokens := map[string]bool{lowered: true}
	for _, t := range tokenSeparators.Split(lowered, -1) {
		if t != "" {
			tokens[t] = true
		}
	}
	for _, n := range names {
		if tokens[strings.ToLower(n)] {
			return true
		}
	}
	return false
}

// cardAllowed: the card is healthy and passes the pod's model and UUID filters.
func cardAllowed(card CardState, d PodDemand) bool {
	if !card.Healthy {
		return false
	}
	if (len(d.UseUUIDs) > 0 && !d.UseUUIDs[card.UUID]) || d.NouseUUIDs[card.UUID] {
		return false
	}
	if len(d.UseTypes) > 0 && !modelMatches(card.Model, d.UseTypes) {
		return false
	}
	return !(len(d.NouseTypes) > 0 && modelMatches(card.Model, d.NouseTypes))
}

// staleReason says why the node's inventory cannot be trusted at now (unix s), "" when it
// can: a problem, no heartbeat, one older than the timeout or too far ahead of the clock.
func staleReason(n NodeState, now float64, l Limits) string {
	if n.Problem != "" {
		return n.Problem
	}
	if n.Heartbeat == nil {
		return "no inventory heartbeat (annotation egpu.io/inventory-heartbeat missing)"
	}
	heartbeat := *n.Heartbeat
	oldest, newest := now-l.HeartbeatTimeoutS, now+heartbeatFutureSkewS
	if oldest <= heartbeat && heartbeat <= newest {
		return ""
	}
	age := now - heartbeat
	if heartbeat > newest {
		return fmt.Sprintf("inventory heartbeat is %.0f s in the future (more than %.0f s "+
			"ahead of the scheduler's clock): the node's clock is wrong, so whether its node "+
			"agent is reporting cannot be told", -age, heartbeatFutureSkewS)
	}
	return fmt.Sprintf("inventory heartbeat is %.0f s old (limit %.0f s): the node agent is "+
		"not reporting", age, l.HeartbeatTimeoutS)
}

// filterReason says why no card of the node is allowed for the pod.
func filterReason(n NodeState, d PodDemand) string {
	if len(n.Cards) == 0 {
		return "the node has no GPU cards in its inventory"
	}
	counts := map[string]int{}
	for _, c := range n.Cards {
		if c.Healthy {
			counts[c.Model]++
		}
	}
	if len(counts) == 0 {
		return fmt.Sprintf("no healthy card (%d unhealthy)", len(n.Cards))
	}
	var parts []string
	if len(d.UseTypes) > 0 {
		parts = append(parts, "use-gpu-type "+strings.Join(d.UseTypes, ","))
	}
	if len(d.NouseTypes) > 0 {
		parts = append(parts, "nouse-gpu-type "+strings.Join(d.NouseTypes, ","))
	}
	if len(d.UseUUIDs) > 0 {
		parts = append(parts, "use-gpu-uuid")
	}
	if len(d.NouseUUIDs) > 0 {
		parts = append(parts, "nouse-gpu-uuid")
	}
	filters := strings.Join(parts, " and ")
	if filters == "" {
		filters = "the filters"
	}
	models := make([]string, 0, len(counts))
	for m := range counts {
		models = append(models, m)
	}
	sort.Strings(models)
	for i, m := range models {
		models[i] = fmt.Sprintf("%d x %s", counts[m], m)
	}
	return fmt.Sprintf("no card passes %s (cards: %s)", filters, strings.Join(models, ", "))
}
