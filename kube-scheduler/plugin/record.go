package plugin

import (
	"github.com/egpu/egpu/kube-scheduler/gate"
	"github.com/egpu/egpu/kube-scheduler/placement"
	"github.com/egpu/egpu/kube-scheduler/records"
)

// allocationRecord is the egpu.io/allocation record the Binding writes
// (egpu/records.py's format): the placement's cards, each container's kind, and
// the pod's priority, compute policy and memory oversubscription, resolved once for all its
// readers.
func allocationRecord(node string, d *demand, placed *placement.Placement) records.Allocation {
	priority, policy, oversubscribe := d.priority, d.computePolicy, d.Oversubscribe
	a := records.Allocation{Node: node, Priority: &priority, ComputePolicy: &policy,
		MemoryOversubscription: &oversubscribe}
	for _, c := range placed.Containers {
		ca := records.ContainerAllocation{Name: c.Name, Kind: d.kinds[c.Name], Init: c.Init}
		for _, s := range c.Cards {
			ca.Cards = append(ca.Cards, records.CardShare{UUID: s.UUID, Index: int64(s.Index),
				MemoryMiB: int64(s.MemoryMiB), Cores: int64(s.Cores)})
		}
		a.Containers = append(a.Containers, ca)
	}
	return a
}

// sizesOf is the gate's view of a placement: its containers' cards.
func sizesOf(p *placement.Placement) gate.Sizes {
	cards := make([][]string, 0, len(p.Containers))
	for _, c := range p.Containers {
		uuids := make([]string, 0, len(c.Cards))
		for _, s := range c.Cards {
			uuids = append(uuids, s.UUID)
		}
		cards = append(cards, uuids)
	}
	return gate.SizesOf(cards)
}

// recordSizes is the gate's view of a pod's record.
func recordSizes(a records.Allocation) gate.Sizes {
	cards := make([][]string, 0, len(a.Containers))
	for _, c := range a.Containers {
		uuids := make([]string, 0, len(c.Cards))
		for _, s := range c.Cards {
			uuids = append(uuids, s.UUID)
		}
		cards = append(cards, uuids)
	}
	return gate.SizesOf(cards)
}
