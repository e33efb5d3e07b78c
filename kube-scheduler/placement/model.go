// Package placement is egpu's card placement, ported from the Python
// scheduler/placement (issue 24, docs/scheduler.md "The placement inside kube-scheduler"):
// fit one pod's shares onto one node's cards, card by card. Pure: plain data in, a decision
// out, no Kubernetes objects and no I/O. Units: MiB, % of one card's compute, share slots.
//
// tests/scheduler/placement_cases.yaml is the yardstick both implementations answer to
// (placement_test.go here, tests/scheduler/test_placement_cases.py there).
package placement

import "fmt"

// Kind is a container's kind: app, plain init, or sidecar (an init container with
// restartPolicy Always).
type Kind int

const (
	App Kind = iota
	Init
	Sidecar
)

// Share is what one container asks of each of its cards (egpu/requests.py Share). GPUs: cards
// (1..16). MemoryMiB: MiB per card when HasMemoryMiB, else MemoryPercentage % of each card's
// memory (1..100; the pod reader sets 100 when no memory was given). Cores: % of each card's
// compute, 0 = none booked.
type Share struct {
	GPUs             int
	MemoryMiB        int
	HasMemoryMiB     bool
	MemoryPercentage int
	Cores            int
}

// MemoryOn is the MiB the share books on a card of cardMiB MiB (percentages round down, at
// least 1).
func (s Share) MemoryOn(cardMiB int) int {
	if s.HasMemoryMiB {
		return s.MemoryMiB
	}
	return max(1, cardMiB*s.MemoryPercentage/100)
}

// Describe is the share as refusals word it: "1 card x (24000 MiB, 50% cores)".
func (s Share) Describe() string {
	memory := fmt.Sprintf("%d%% memory", s.MemoryPercentage)
	if s.HasMemoryMiB {
		memory = fmt.Sprintf("%d MiB", s.MemoryMiB)
	}
	cores := "no cores booked"
	if s.Cores != 0 {
		cores = fmt.Sprintf("%d%% cores", s.Cores)
	}
	cards := "cards"
	if s.GPUs == 1 {
		cards = "card"
	}
	return fmt.Sprintf("%d %s x (%s, %s)", s.GPUs, cards, memory, cores)
}

// ContainerDemand is one container with a share; Order is its position in the pod spec
// (init containers first, in their declared order, then app containers).
type ContainerDemand struct {
	Name  string
	Kind  Kind
	Share Share
	Order int
}

// PodDemand is what placement needs of a pod: its shares in placement order (NewPodDemand),
// its card filters and policies ("binpack" or "spread").
type PodDemand struct {
	Containers    []ContainerDemand
	Oversubscribe bool
	UseTypes      []string
	NouseTypes    []string
	UseUUIDs      map[string]bool
	NouseUUIDs    map[string]bool
	GPUPolicy     Policy
	NodePolicy    Policy
}

// NewPodDemand orders the pod's containers for the search: app and sidecar containers first,
// most cards first (then spec order), then the init containers in spec order. containers:
// every container with a share, in spec order, each with its Order set.
func NewPodDemand(containers []ContainerDemand) []ContainerDemand {
	var steady, inits []ContainerDemand
	for _, c := range containers {
		if c.Kind == Init {
			inits = append(inits, c)
		} else {
			steady = append(steady, c)
		}
	}
	sortStable(steady, func(a, b ContainerDemand) bool {
		if a.Share.GPUs != b.Share.GPUs {
			return a.Share.GPUs > b.Share.GPUs
		}
		return a.Order < b.Order
	})
	return append(steady, inits...)
}

// CardState is one card as placement sees it: identity, capacity (MiB), and the other pods'
// bookings on it.
type CardState struct {
	UUID        string
	Index       int
	Model       string
	CapacityMiB int
	Healthy     bool
	BookedMiB   int
	BookedCores int
	UsedSlots   int
}

func (c CardState) fullness() float64 { return float64(c.BookedMiB) / float64(c.CapacityMiB) }

func (c CardState) label() string {
	return fmt.Sprintf("card %d (%s, %d MiB)", c.Index, c.Model, c.CapacityMiB)
}

func (c CardState) emptied() CardState {
	c.BookedMiB, c.BookedCores, c.UsedSlots = 0, 0, 0
	return c
}

// NodeState is one node: its cards, its heartbeat (unix seconds; nil: never) and, when its
// inventory could not be used, why (Problem).
type NodeState struct {
	Name      string
	Cards     []CardState
	Heartbeat *float64
	Problem   string
}

// capacity is the MiB of the node's healthy cards, and what is booked on them.
func (n NodeState) capacity() (capacityMiB, bookedMiB int) {
	for _, c := range n.Cards {
		if c.Healthy {
			capacityMiB += c.CapacityMiB
			bookedMiB += c.BookedMiB
		}
	}
	return capacityMiB, bookedMiB
}

// Limits are the cluster-wide bounds of egpu's config (sharesPerCard, the oversubscription
// ratios, heartbeatTimeoutSeconds).
type Limits struct {
	SharesPerCard     int
	MemoryRatio       float64
	CoresRatio        float64
	HeartbeatTimeoutS float64
}

// CardBooking is what one pod books on one card: MiB, % of its compute, share slots.
type CardBooking struct {
	MemoryMiB int
	Cores     int
	Slots     int
}

// CardShare is a container's share of one card, as the egpu.io/allocation record says.
type CardShare struct {
	UUID      string
	Index     int
	MemoryMiB int
	Cores     int
}

// ContainerAllocation is the cards given to one container; Init: an init container
// (sidecars included).
type ContainerAllocation struct {
	Name  string
	Init  bool
	Cards []CardShare
}

// Placement is a pod fitted on a node: its containers' cards in spec order, what it books per
// card UUID, and the node's booked/capacity MiB over its healthy cards with the pod placed.
type Placement struct {
	Node        string
	Containers  []ContainerAllocation
	Bookings    map[string]CardBooking
	Utilization float64
}

// Unfit says why a pod does not fit a node; Unresolvable: not even on the node emptied of
// other pods' bookings (preempting cannot help).
type Unfit struct {
	Node         string
	Reason       string
	Unresolvable bool
}
