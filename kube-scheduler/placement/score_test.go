package placement

import "testing"

// NodeScore as scheduler/strategies scores nodes: binpack round(10 x utilization), spread 10
// minus that, rounding half to even, kept within 0..10 (a utilization below 0 or above 1
// comes from inconsistent bookings or memory oversubscription). Bug caught: a score outside
// 0..10, which kube-scheduler's framework refuses from a Score plugin.
func TestNodeScoreIsPythonsRoundWithin0To10(t *testing.T) {
	for _, c := range []struct {
		utilization     float64
		binpack, spread int
	}{
		{-0.2, 0, 10}, {0, 0, 10}, {0.05, 0, 10}, {0.15, 2, 8}, {0.25, 2, 8}, {0.5, 5, 5},
		{0.94, 9, 1}, {1, 10, 0}, {1.5, 10, 0},
	} {
		if got := NodeScore(Binpack, c.utilization); got != c.binpack {
			t.Errorf("binpack at %v: %d, want %d", c.utilization, got, c.binpack)
		}
		if got := NodeScore(Spread, c.utilization); got != c.spread {
			t.Errorf("spread at %v: %d, want %d", c.utilization, got, c.spread)
		}
	}
}
