package plugin

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/egpu/egpu/kube-scheduler/placement"
	"github.com/egpu/egpu/kube-scheduler/records"
)

// The node agent's annotations (../shared/CONTRACT.md, section 2).
const (
	annInventory      = "egpu.io/inventory"
	annHeartbeat      = "egpu.io/inventory-heartbeat"
	annAllocation     = "egpu.io/allocation"
	annAllocationMode = "egpu.io/allocation-mode"
	allocationModeDRA = "dra"
)

// The refusals of a node whose cards the plugin cannot use (scheduler/state.py node_record's
// words).
const (
	draNode = "this node takes egpu shares through DRA (egpu.io/allocation-mode: dra, its node " +
		"agent serves no device plugin); extender shares go to nodes whose agent serves the " +
		"device plugin"
	noInventory = "no egpu inventory on this node (annotation egpu.io/inventory missing)"
)

// nodeAnnotations are what the plugin reads of a node.
type nodeAnnotations struct {
	inventory, heartbeat, mode string
	hasInventory               bool
}

func annotationsOf(a map[string]string) nodeAnnotations {
	inventory, ok := a[annInventory]
	return nodeAnnotations{inventory, a[annHeartbeat], a[annAllocationMode], ok}
}

// parsedNode is a node's cards and heartbeat, decoded from its annotations.
type parsedNode struct {
	annotations nodeAnnotations
	state       placement.NodeState
}

// parseNode is the node's state from its annotations, none of its cards booked
// (scheduler/state.py node_record). A node of the DRA pool, or one whose inventory is missing
// or does not decode, has no cards and says why (Problem); a heartbeat that does not read as
// RFC 3339 is none (the node is stale).
func parseNode(name string, a nodeAnnotations) placement.NodeState {
	state := placement.NodeState{Name: name}
	if t, err := time.Parse(time.RFC3339, a.heartbeat); err == nil {
		unix := float64(t.Unix())
		state.Heartbeat = &unix
	}
	switch {
	case a.mode == allocationModeDRA:
		state.Problem = draNode
		return state
	case !a.hasInventory:
		state.Problem = noInventory
		return state
	}
	decoded, err := records.DecodeInventory(a.inventory)
	if err != nil {
		state.Problem = "egpu inventory unreadable: " + err.Error()
		return state
	}
	for _, c := range decoded.Cards {
		state.Cards = append(state.Cards, placement.CardState{UUID: c.UUID,
			Index: int(c.Index), Model: c.Model, CapacityMiB: int(c.MemoryMiB),
			Healthy: c.Healthy})
	}
	return state
}

// booked is base with bookings added card by card (by UUID); base is not changed.
func booked(base placement.NodeState, bookings []map[string]placement.CardBooking) placement.NodeState {
	use := map[string]placement.CardBooking{}
	for _, b := range bookings {
		for uuid, x := range b {
			u := use[uuid]
			use[uuid] = placement.CardBooking{MemoryMiB: u.MemoryMiB + x.MemoryMiB,
				Cores: u.Cores + x.Cores, Slots: u.Slots + x.Slots}
		}
	}
	state := base
	state.Cards = make([]placement.CardState, len(base.Cards))
	for i, c := range base.Cards {
		u := use[c.UUID]
		c.BookedMiB, c.BookedCores, c.UsedSlots = u.MemoryMiB, u.Cores, u.Slots
		state.Cards[i] = c
	}
	return state
}

// bookedNode is a node's state with all its pods' bookings, kept for one generation of the
// scheduler's NodeInfo: a pod added to the node, removed, or updated there (its record
// written at bind) changes the generation, and a new annotation changes the parsed state it
// was built on. records are the bookings of the node's pods' records by pod, decoded once
// and carried to the next generation for the pods still there (so a pod gone leaves none).
type bookedNode struct {
	generation int64
	parsed     *parsedNode
	state      placement.NodeState
	records    map[types.UID]map[string]placement.CardBooking
}
