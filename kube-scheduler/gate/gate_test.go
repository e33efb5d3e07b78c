package gate

import (
	"reflect"
	"testing"
)

func one(card string) Sizes { return SizesOf([][]string{{card}}) }

// letAll lets every offered pod through and records the order.
func letAll(got *[]string) func(string) bool {
	return func(uid string) bool { *got = append(*got, uid); return true }
}

func TestConflictsIsAdmissionConflictsRule(t *testing.T) {
	for _, c := range []struct {
		name      string
		a, b      Sizes
		conflicts bool
	}{
		{"one card each, the same card", one("A"), one("A"), false},
		{"one card each, other cards", one("A"), one("B"), true},
		{"other slot counts never meet", one("A"), SizesOf([][]string{{"B", "C"}}), false},
		{"two cards, the same set in another order", SizesOf([][]string{{"A", "B"}}),
			SizesOf([][]string{{"B", "A"}}), false},
		{"two cards, sets that overlap", SizesOf([][]string{{"A", "B"}}),
			SizesOf([][]string{{"B", "C"}}), true},
		{"a pod whose own containers use two cards", one("A"),
			SizesOf([][]string{{"A"}, {"B"}}), true},
		{"no shares", Sizes{}, one("A"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.a.Conflicts(c.b); got != c.conflicts {
				t.Fatalf("Conflicts = %v, want %v", got, c.conflicts)
			}
			if got := c.b.Conflicts(c.a); got != c.conflicts {
				t.Fatalf("reversed: Conflicts = %v, want %v", got, c.conflicts)
			}
		})
	}
}

func TestAPodOnAnotherCardWaitsUntilTheFirstIsAdmitted(t *testing.T) {
	g := New()
	if g.Enter("n1", "p1", one("A")) {
		t.Fatal("the first pod on the node was held")
	}
	if !g.WouldHold("n1", "p2", one("B")) || !g.Enter("n1", "p2", one("B")) {
		t.Fatal("a pod on another card was let through while p1 awaits admission")
	}
	if g.Enter("n1", "p3", one("A")) || g.Enter("n2", "p4", one("B")) {
		t.Fatal("a pod on p1's card, or on another node, was held")
	}
	var let []string
	g.Done("p1", letAll(&let))
	if len(let) != 0 {
		t.Fatalf("let %v through while p3 (card A) still awaits admission", let)
	}
	g.Done("p3", letAll(&let))
	if !reflect.DeepEqual(let, []string{"p2"}) || g.Held() != 0 {
		t.Fatalf("let %v through, %d held; want p2, 0", let, g.Held())
	}
	if !g.WouldHold("n1", "p5", one("A")) {
		t.Fatal("p2, let through, does not count as awaiting admission")
	}
}

func TestHeldPodsGoThroughOneAtATime(t *testing.T) {
	g := New()
	g.Enter("n1", "p1", one("A"))
	g.Enter("n1", "p2", one("B"))
	g.Enter("n1", "p3", one("C"))
	var let []string
	g.Done("p1", letAll(&let))
	if !reflect.DeepEqual(let, []string{"p2"}) || g.Held() != 1 {
		t.Fatalf("let %v through, %d held; want p2 alone (p3 conflicts with it), 1", let, g.Held())
	}
	g.Done("p2", letAll(&let))
	if !reflect.DeepEqual(let, []string{"p2", "p3"}) || g.Held() != 0 {
		t.Fatalf("let %v through, %d held", let, g.Held())
	}
}

func TestAPodNotWaitingYetStaysHeldUntilTheSweep(t *testing.T) {
	g := New()
	g.Enter("n1", "p1", one("A"))
	g.Enter("n1", "p2", one("B"))
	g.Done("p1", func(string) bool { return false }) // the framework does not list p2 yet
	if g.Held() != 1 {
		t.Fatal("a pod the framework could not let through was dropped")
	}
	var let []string
	g.Sweep(letAll(&let))
	if !reflect.DeepEqual(let, []string{"p2"}) || g.Held() != 0 {
		t.Fatalf("the sweep let %v through, %d held", let, g.Held())
	}
}

func TestABindingGivenUpReleasesWhatItHeld(t *testing.T) {
	g := New()
	g.Enter("n1", "p1", one("A"))
	g.Enter("n1", "p2", one("B"))
	g.Enter("n1", "p3", one("C"))
	var let []string
	g.Forget("n1", "p2", letAll(&let)) // a held pod given up releases nothing
	if len(let) != 0 || g.Held() != 1 {
		t.Fatalf("let %v through, %d held; want none, 1", let, g.Held())
	}
	g.Forget("n1", "p1", letAll(&let))
	if !reflect.DeepEqual(let, []string{"p3"}) {
		t.Fatalf("let %v through; want p3", let)
	}
	g.Done("p3", letAll(&let))
	if g.Nodes() != 0 {
		t.Fatalf("the gate keeps %d node(s) with no pod", g.Nodes())
	}
}

func TestAPodSeenBoundCountsUntilAdmittedAndKeepsItsEntry(t *testing.T) {
	g := New()
	g.Bound("n1", "p1", one("A"))
	if !g.Enter("n1", "p2", one("B")) {
		t.Fatal("a pod seen bound and not admitted did not hold a pod on another card")
	}
	g.Bound("n1", "p1", one("B")) // an update of a pod it knows changes nothing
	if g.WouldHold("n1", "p3", one("A")) {
		t.Fatal("the pod's entry changed on a second Bound")
	}
	if g.WouldHold("n1", "p1", one("C")) {
		t.Fatal("a pod conflicts with its own entry")
	}
}

// Bug caught: a node's map of held pods left behind, empty, when its last held pod is given up
// with nothing to release: one entry per node the scheduler ever held a pod on.
func TestTheGateKeepsNoNodeWithoutPods(t *testing.T) {
	g := New()
	g.Enter("n1", "p1", one("A"))
	g.Enter("n1", "p2", one("B"))
	g.Done("p1", func(string) bool { return false }) // p2 not listed as waiting yet
	g.Forget("n1", "p2", func(string) bool { return true })
	if g.Nodes() != 0 || g.Held() != 0 {
		t.Fatalf("the gate keeps %d node(s), %d held pod(s)", g.Nodes(), g.Held())
	}
}
