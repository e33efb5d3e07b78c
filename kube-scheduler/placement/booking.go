package placement

import (
	"sort"

	"github.com/egpu/egpu/kube-scheduler/records"
)

// bookCard is one pod's booking on one card: Kubernetes' effective-request rule per card
// (egpu/booking.py book_card), for memory, cores and slots each on its own:
// max(sum of app + sidecar shares, max over init containers of the init's share + the
// sidecars declared before it). entries: the pod's containers with a share of the card, in
// spec order.
func bookCard(entries []entry) CardBooking {
	var steady, side, peak CardBooking
	for _, e := range entries {
		if e.kind == Init {
			peak.MemoryMiB = max(peak.MemoryMiB, side.MemoryMiB+e.mib)
			peak.Cores = max(peak.Cores, side.Cores+e.cores)
			peak.Slots = max(peak.Slots, side.Slots+1)
			continue
		}
		steady.MemoryMiB += e.mib
		steady.Cores += e.cores
		steady.Slots++
		if e.kind == Sidecar {
			side.MemoryMiB += e.mib
			side.Cores += e.cores
			side.Slots++
		}
	}
	return CardBooking{max(steady.MemoryMiB, peak.MemoryMiB), max(steady.Cores, peak.Cores),
		max(steady.Slots, peak.Slots)}
}

// entry is one container's share of one card: its spec order, kind, MiB and cores %.
type entry struct {
	order int
	kind  Kind
	mib   int
	cores int
}

func sortStable[T any](s []T, less func(a, b T) bool) {
	sort.SliceStable(s, func(i, j int) bool { return less(s[i], s[j]) })
}

// BookingsOf is what the pod of an allocation record books per card UUID
// (egpu/booking.py record_bookings): bookCard over the record's containers in its order, the
// pod's spec order, each by the kind the record carries (an older record's, without kinds,
// as app containers: summed, which never books less).
func BookingsOf(a records.Allocation) map[string]CardBooking {
	perCard := map[string][]entry{}
	for i, c := range a.Containers {
		kind := App
		switch c.Kind {
		case records.KindInit:
			kind = Init
		case records.KindSidecar:
			kind = Sidecar
		}
		for _, s := range c.Cards {
			perCard[s.UUID] = append(perCard[s.UUID], entry{i, kind, int(s.MemoryMiB),
				int(s.Cores)})
		}
	}
	out := make(map[string]CardBooking, len(perCard))
	for uuid, entries := range perCard {
		out[uuid] = bookCard(entries)
	}
	return out
}
