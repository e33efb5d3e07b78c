package placement

import (
	"reflect"
	"testing"

	"github.com/egpu/egpu/kube-scheduler/records"
)

// BookingsOf as egpu/booking.py record_bookings books the same records (values checked
// there): FC-07's init 12000 MiB/100% before an app 8000 MiB/20% on one card books the larger,
// one slot; a sidecar runs beside the app (summed) and beside an init declared after it; an
// older record's containers, without kinds, are summed. Bug caught: a plugin booking an init
// container's share on top of the app's (the card fills early) or below it (overbooked).
func TestBookingsOfIsTheEffectiveRequestPerCard(t *testing.T) {
	share := func(uuid string, mib, cores int64) []records.CardShare {
		return []records.CardShare{{UUID: uuid, MemoryMiB: mib, Cores: cores}}
	}
	for _, c := range []struct {
		name       string
		containers []records.ContainerAllocation
		want       map[string]CardBooking
	}{
		{"FC-07 init then app", []records.ContainerAllocation{
			{Name: "i", Kind: records.KindInit, Init: true, Cards: share("A", 12000, 100)},
			{Name: "c", Kind: records.KindApp, Cards: share("A", 8000, 20)},
		}, map[string]CardBooking{"A": {12000, 100, 1}}},
		{"sidecar, init, app", []records.ContainerAllocation{
			{Name: "s", Kind: records.KindSidecar, Init: true, Cards: share("A", 3000, 10)},
			{Name: "i", Kind: records.KindInit, Init: true, Cards: share("A", 12000, 50)},
			{Name: "c", Kind: records.KindApp, Cards: share("A", 8000, 20)},
		}, map[string]CardBooking{"A": {15000, 60, 2}}},
		{"an older record, on two cards", []records.ContainerAllocation{
			{Name: "i", Init: true, Cards: share("A", 12000, 0)},
			{Name: "c", Cards: append(share("A", 8000, 0), share("B", 1, 0)...)},
		}, map[string]CardBooking{"A": {20000, 0, 2}, "B": {1, 0, 1}}},
	} {
		got := BookingsOf(records.Allocation{Containers: c.containers})
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
