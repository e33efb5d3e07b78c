package plugin

import (
	"time"

	"github.com/egpu/egpu/kube-scheduler/placement"
	"github.com/egpu/egpu/kube-scheduler/records"
)

// The node agent's annotations (../shared/CONTRACT.md, section 2).
const (
	annInventory  = "egpu.io/inventory"
	annHeartbeat  = "egpu.io/inventory-heartbeat"
	annAllocation = "egpu.io/allocation"
)

// parsedNode is a node's cards and heartbeat, decoded from the annotations' texts.
type parsedNode struct {
	inventory, heartbeat string
	state                placement.NodeState
}

// parseNode is the node's state from its annotations, none of its cards booked. An
// inventory that does not decode leaves the node without cards and says why (Problem); a
// heartbeat that does not read as RFC 3339 is none (the node is stale).
func parseNode(name, inventory, heartbeat string) placement.NodeState {
	state := placement.NodeState{Name: name}
	if t, err := time.Parse(time.RFC3339, heartbeat); err == nil {
		unix := float64(t.Unix())
		state.Heartbeat = &unix
	}
	decoded, err := records.DecodeInventory(inventory)
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
// written at bind) changes the generation, and a new inventory or heartbeat text changes
// the parsed state it was built on.
type bookedNode struct {
	generation int64
	parsed     *parsedNode
	state      placement.NodeState
}
