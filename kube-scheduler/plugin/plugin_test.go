package plugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientfake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"
	fwk "k8s.io/kube-scheduler/framework"
	schedcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/egpu/egpu/kube-scheduler/config"
	"github.com/egpu/egpu/kube-scheduler/placement"
)

// inventory is one node's egpu.io/inventory: cards of 24000 MiB, UUIDs GPU-0, GPU-1, ...
func inventory(cards int) string {
	var rows []string
	for i := range cards {
		rows = append(rows, `{"uuid":"GPU-`+string(rune('0'+i))+`","index":`+
			string(rune('0'+i))+`,"model":"NVIDIA A10","memory_mib":24000,"healthy":true,`+
			`"numa_node":0,"driver_memory_limit":false}`)
	}
	return `{"version":1,"cards":[` + strings.Join(rows, ",") + `]}`
}

func node(name string, cards int) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
		annInventory: inventory(cards),
		annHeartbeat: time.Now().UTC().Format(time.RFC3339)}}}
}

// sharePod asks for one card of mib MiB in its one container.
func sharePod(name string, mib int64) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
		UID: types.UID(name)}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main",
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
			resMemory: *resource.NewQuantity(mib, resource.DecimalSI)}}}}}}
}

// recorded is pod bound to node with a record that books mib MiB of card GPU-<card>.
func recorded(pod *v1.Pod, nodeName string, card int, mib int64) *v1.Pod {
	a := allocationRecord(nodeName, &demand{kinds: map[string]string{"main": "container"},
		priority: "high", computePolicy: "strict"}, placementOn(card, mib))
	text, err := a.Encode()
	if err != nil {
		panic(err)
	}
	pod = pod.DeepCopy()
	pod.Spec.NodeName = nodeName
	pod.Annotations = map[string]string{annAllocation: text}
	return pod
}

func nodeInfo(n *v1.Node, pods ...*v1.Pod) *framework.NodeInfo {
	info := framework.NewNodeInfo(pods...)
	info.SetNode(n)
	return info
}

// preFiltered is a fresh cycle for pod, after PreFilter.
func preFiltered(t *testing.T, p *Plugin, pod *v1.Pod) fwk.CycleState {
	t.Helper()
	state := framework.NewCycleState()
	if _, status := p.PreFilter(context.Background(), state, pod, nil); !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	return state
}

func TestAPodWithoutSharesIsSkipped(t *testing.T) {
	p := newPlugin(nil, defaultSettings())
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", UID: "plain"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}}
	_, status := p.PreFilter(context.Background(), framework.NewCycleState(), pod, nil)
	if !status.IsSkip() {
		t.Fatalf("PreFilter = %v, want Skip", status)
	}
}

// The words are the reader's (request_cases.yaml); here, that PreFilter refuses with them.
func TestAMalformedSharePodIsUnschedulableAndUnresolvableWithTheReadersWords(t *testing.T) {
	p := newPlugin(nil, defaultSettings())
	pod := sharePod("p", 1)
	pod.Spec.Containers[0].Resources.Limits[resMemory] = resource.MustParse("500m")
	_, status := p.PreFilter(context.Background(), framework.NewCycleState(), pod, nil)
	want := "invalid egpu request: container 'main': egpu.io/gpu-memory='500m' is not allowed"
	if status.Code() != fwk.UnschedulableAndUnresolvable ||
		!strings.HasPrefix(status.Message(), want) {
		t.Fatalf("PreFilter = %v, want UnschedulableAndUnresolvable saying %q", status, want)
	}
}

// Bug caught: the booked state kept by node name alone, so a pod bound after it was built
// (a new NodeInfo generation) books nothing and the card is overbooked.
func TestAPodBoundToTheNodeCountsInTheNextCycle(t *testing.T) {
	p := newPlugin(nil, defaultSettings())
	n := node("n1", 1)
	before := nodeInfo(n)
	if s := p.Filter(context.Background(), preFiltered(t, p, sharePod("a", 16000)),
		sharePod("a", 16000), before); !s.IsSuccess() {
		t.Fatalf("Filter on the empty card: %v", s)
	}
	after := nodeInfo(n, recorded(sharePod("b", 1), "n1", 0, 20000))
	pod := sharePod("c", 16000)
	s := p.Filter(context.Background(), preFiltered(t, p, pod), pod, after)
	if s.Code() != fwk.Unschedulable {
		t.Fatalf("Filter with 20000 of 24000 MiB booked = %v, want Unschedulable", s)
	}
}

// Bug caught: Reserve not holding the placement, so the next pod is fitted on the card
// before the first's record exists and the card is overbooked.
func TestAReservedPodBooksItsCardUntilItsRecordIsSeen(t *testing.T) {
	n := node("n1", 1)
	first := sharePod("first", 16000)
	h := &fakeHandle{snapshot: schedcache.NewSnapshot(nil, []*v1.Node{n})}
	p := newPlugin(h, defaultSettings())
	state := preFiltered(t, p, first)
	info, _ := h.snapshot.NodeInfos().Get("n1")
	if s := p.Filter(context.Background(), state, first, info); !s.IsSuccess() {
		t.Fatalf("Filter: %v", s)
	}
	if s := p.Reserve(context.Background(), state, first, "n1"); !s.IsSuccess() {
		t.Fatalf("Reserve: %v", s)
	}
	assumed := first.DeepCopy()
	assumed.Spec.NodeName = "n1" // the scheduler's cache assumes it on the node
	second := sharePod("second", 16000)
	s := p.Filter(context.Background(), preFiltered(t, p, second), second,
		nodeInfo(n, assumed))
	if s.Code() != fwk.Unschedulable {
		t.Fatalf("Filter beside a reservation of 16000 MiB = %v, want Unschedulable", s)
	}
	p.Unreserve(context.Background(), state, first, "n1")
	s = p.Filter(context.Background(), preFiltered(t, p, second), second, nodeInfo(n))
	if !s.IsSuccess() {
		t.Fatalf("Filter after Unreserve = %v", s)
	}
}

// Bug caught: a node where the gate would hold the pod outscoring (or tying with) a node
// that takes it at once: binpack scores a nearly empty node 0 too.
func TestANodeWhereTheGateWouldHoldThePodScores0AndEveryOtherAtLeast1(t *testing.T) {
	p := newPlugin(&fakeHandle{}, defaultSettings())
	busy := node("busy", 2)
	waiting := recorded(sharePod("waiting", 1), "busy", 0, 23000) // not admitted yet
	p.observe(waiting, false)
	pod := sharePod("p", 2000)
	state := preFiltered(t, p, pod)
	held, _ := p.Score(context.Background(), state, pod, nodeInfo(busy, waiting))
	idle, _ := p.Score(context.Background(), state, pod, nodeInfo(node("idle", 8)))
	if held != 0 || idle < 1 {
		t.Fatalf("scores: held node %d (want 0), idle node %d (want >= 1)", held, idle)
	}
	admittedPod := waiting.DeepCopy()
	admittedPod.Status.Phase = v1.PodRunning
	p.observe(admittedPod, false)
	state = preFiltered(t, p, pod)
	if got, _ := p.Score(context.Background(), state, pod, nodeInfo(busy, admittedPod)); got < 1 {
		t.Fatalf("score once the pod there is admitted = %d, want >= 1", got)
	}
}

func TestTheRecordSaysEachContainersKindAndThePodsPolicies(t *testing.T) {
	p := newPlugin(nil, defaultSettings())
	always := v1.ContainerRestartPolicyAlways
	pod := sharePod("p", 1000)
	pod.Spec.InitContainers = []v1.Container{{Name: "proxy", RestartPolicy: &always,
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
			resMemory: resource.MustParse("1000")}}}}
	pod.Labels = map[string]string{labelPriority: "low"}
	pod.Annotations = map[string]string{annComputePolicy: "elastic"}
	state := preFiltered(t, p, pod)
	info := nodeInfo(node("n1", 1))
	if s := p.Filter(context.Background(), state, pod, info); !s.IsSuccess() {
		t.Fatalf("Filter: %v", s)
	}
	text, err := allocationRecord("n1", cycleOf(state).demand,
		p.fit(cycleOf(state), pod, info).placed).Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"version":1,"node":"n1","priority":"low","compute_policy":"elastic",` +
		`"memory_oversubscription":false,"containers":[` +
		`{"name":"proxy","kind":"sidecar","init":true,"cards":[{"uuid":"GPU-0","index":0,"memory_mib":1000,"cores":0}]},` +
		`{"name":"main","kind":"container","init":false,"cards":[{"uuid":"GPU-0","index":0,"memory_mib":1000,"cores":0}]}]}`
	if text != want {
		t.Fatalf("record\n got %s\nwant %s", text, want)
	}
}

// Bug caught: an args field misspelt in a profile read as absent, so that the plugin ran on
// egpu's defaults instead of the cluster's config file.
func TestArgsNameAnUnknownFieldAndTheAllowedOnes(t *testing.T) {
	if got, err := DecodeArgs(nil); err != nil || got != (Args{}) {
		t.Fatalf("no args = %+v, %v; want none", got, err)
	}
	for raw, says := range map[string]string{
		`{"configFile": "/etc/egpu/config.yaml", "configKeepDir": "/var/lib/egpu"}`: "",
		`{"configfile": "/etc/egpu/config.yaml"}`:                                   `unknown field "configfile"; allowed fields: configFile, configKeepDir`,
		`{"sharesPerCard": 4}`: `unknown field "sharesPerCard"; allowed fields: configFile, configKeepDir`,
		`["configFile"]`:       "expected a JSON object",
	} {
		_, err := DecodeArgs(&runtime.Unknown{Raw: []byte(raw)})
		if says == "" && err != nil || says != "" && (err == nil || !strings.Contains(err.Error(), says)) {
			t.Errorf("%s: %v; want %q", raw, err, says)
		}
	}
}

// Bugs caught: the plugin placing shares by egpu's default limits and policies while the
// cluster's config file says others (sharesPerCard, the default node policy, a PriorityClass's
// priority), or starting on a bad file it never had a good copy of.
func TestTheConfigFileSetsTheLimitsAndTheDefaults(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	text := "sharesPerCard: 4\ndefaults: {nodePolicy: spread}\npriorityClasses: {batch: low}\n"
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Args{ConfigFile: file}.load()
	if err != nil {
		t.Fatal(err)
	}
	if s.limits.SharesPerCard != 4 || s.limits.HeartbeatTimeoutS != 120 {
		t.Errorf("limits %+v; want 4 shares a card and the default heartbeat timeout", s.limits)
	}
	pod := sharePod("p", 1000)
	pod.Spec.PriorityClassName = "batch"
	d, err := readDemand(pod, s)
	if err != nil {
		t.Fatal(err)
	}
	if d.NodePolicy != placement.Spread || d.GPUPolicy != placement.Binpack || d.priority != "low" {
		t.Errorf("node policy %s, card policy %s, priority %s; want spread, binpack, low",
			d.NodePolicy, d.GPUPolicy, d.priority)
	}
	if err := os.WriteFile(file, []byte("sharesPerCard: 33\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Args{ConfigFile: file}.load()
	if err == nil || !strings.Contains(err.Error(), "sharesPerCard: 33 is out of range; allowed: 1..32") {
		t.Errorf("a bad file with no good copy kept: %v", err)
	}
}

// Bug caught: the cycle's fit kept by node name alone, so preemption's dry run, which adds the
// victims back one by one on its clone, reads "fits" each time and spares every victim.
func TestAPreemptionDryRunFitsAgainAsEachVictimIsAddedBack(t *testing.T) {
	p := newPlugin(nil, defaultSettings())
	victim := recorded(sharePod("victim", 1), "n1", 0, 20000)
	full := nodeInfo(node("n1", 1), victim)
	pod := sharePod("p", 16000)
	dryRun := preFiltered(t, p, pod).Clone()
	emptied := full.Snapshot()
	if err := emptied.RemovePod(klogDiscard(), victim); err != nil {
		t.Fatal(err)
	}
	if s := p.Filter(context.Background(), dryRun, pod, emptied); !s.IsSuccess() {
		t.Fatalf("Filter with the victim removed = %v", s)
	}
	victimInfo, err := framework.NewPodInfo(victim)
	if err != nil {
		t.Fatal(err)
	}
	emptied.AddPodInfo(victimInfo)
	if s := p.Filter(context.Background(), dryRun, pod, emptied); s.Code() != fwk.Unschedulable {
		t.Fatalf("Filter with the victim added back = %v, want Unschedulable", s)
	}
}

// Bug caught: a Binding that the API server wrote but answered with an error freeing the
// pod's cards (Unreserve) until the informer brings the bound pod: another pod overbooks them.
func TestABindingWrittenButAnsweredWithAnErrorStaysBound(t *testing.T) {
	n := node("n1", 1)
	pod := sharePod("p", 16000)
	client := clientfake.NewClientset(pod.DeepCopy())
	client.PrependReactor("create", "pods", func(action clienttesting.Action) (bool,
		runtime.Object, error) {
		if action.GetSubresource() != "binding" {
			return false, nil, nil
		}
		bound := pod.DeepCopy()
		bound.Spec.NodeName = "n1"
		if err := client.Tracker().Update(v1.SchemeGroupVersion.WithResource("pods"), bound,
			"default"); err != nil {
			return true, nil, err
		}
		return true, nil, errors.New("http2: client connection lost")
	})
	h := &fakeHandle{snapshot: schedcache.NewSnapshot(nil, []*v1.Node{n}), client: client}
	p := newPlugin(h, defaultSettings())
	state := preFiltered(t, p, pod)
	info, _ := h.snapshot.NodeInfos().Get("n1")
	p.Filter(context.Background(), state, pod, info)
	if s := p.Reserve(context.Background(), state, pod, "n1"); !s.IsSuccess() {
		t.Fatalf("Reserve: %v", s)
	}
	if s := p.Bind(context.Background(), state, pod, "n1"); !s.IsSuccess() {
		t.Fatalf("Bind of a pod the API server bound = %v, want success", s)
	}
	other := sharePod("other", 16000)
	if s := p.Bind(context.Background(), preFiltered(t, p, other), other, "n1"); s.IsSuccess() {
		t.Fatal("Bind of a pod without a reservation, that the API server did not bind, succeeded")
	}
}

func TestANodeOfTheDRAPoolOrWithoutAnInventoryTakesNoShare(t *testing.T) {
	p := newPlugin(nil, defaultSettings())
	dra, bare := node("dra", 1), node("bare", 0)
	dra.Annotations[annAllocationMode] = "dra"
	delete(bare.Annotations, annInventory)
	for n, says := range map[*v1.Node]string{dra: "takes egpu shares through DRA",
		bare: "annotation egpu.io/inventory missing"} {
		pod := sharePod("p", 1000)
		s := p.Filter(context.Background(), preFiltered(t, p, pod), pod, nodeInfo(n))
		if s.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(s.Message(), says) {
			t.Errorf("%s: Filter = %v, want UnschedulableAndUnresolvable saying %q", n.Name, s,
				says)
		}
	}
}

// Bug caught: a node's last fit reused for a pod of another shape (the cache keyed by node and
// generation alone): a 30000 MiB share "fits" a 24000 MiB card.
func TestANodesLastFitAnswersOnlyAPodOfTheSameShape(t *testing.T) {
	p := newPlugin(nil, defaultSettings())
	info := nodeInfo(node("n1", 1))
	small, large := sharePod("small", 1000), sharePod("large", 30000)
	if s := p.Filter(context.Background(), preFiltered(t, p, small), small, info); !s.IsSuccess() {
		t.Fatalf("Filter of 1000 MiB = %v", s)
	}
	s := p.Filter(context.Background(), preFiltered(t, p, large), large, info)
	if s.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("Filter of 30000 MiB on a 24000 MiB card = %v, want UnschedulableAndUnresolvable", s)
	}
}

// Bug caught: a node's last fit reused past its time, after the node's heartbeat went stale
// (nothing on the node changed, so neither did its generation).
func TestANodesLastFitIsNotReusedOnceItsHeartbeatIsStale(t *testing.T) {
	p := newPlugin(nil, defaultSettings()) // heartbeatTimeoutSeconds 120
	clock := time.Now()
	p.now = func() time.Time { return clock }
	info := nodeInfo(node("n1", 1))
	first, second := sharePod("first", 1000), sharePod("second", 1000)
	if s := p.Filter(context.Background(), preFiltered(t, p, first), first, info); !s.IsSuccess() {
		t.Fatalf("Filter with a fresh heartbeat = %v", s)
	}
	// 121 s on (placement reads the time in whole seconds), the heartbeat is stale; the last
	// fit is made 501 ms old, just past shapeFitFor
	clock = clock.Add(121 * time.Second)
	p.shapes["n1"] = shapeFit{p.shapes["n1"].shape, clock.Add(-501 * time.Millisecond),
		p.shapes["n1"].answer}
	s := p.Filter(context.Background(), preFiltered(t, p, second), second, info)
	if s.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(s.Message(), "heartbeat") {
		t.Fatalf("Filter of a pod of the same shape = %v, want UnschedulableAndUnresolvable "+
			"(stale)", s)
	}
}

// Bug caught: the shape written so that two card filters read alike ("%+v" prints ["a b"]
// and ["a", "b"] both as [a b]): a pod excluding every card reuses the fit of one that
// excludes none.
func TestPodsWhoseCardFiltersDifferHaveOtherShapes(t *testing.T) {
	p := newPlugin(nil, defaultSettings())
	info := nodeInfo(node("n1", 1)) // cards "NVIDIA A10"
	whole, words := sharePod("whole", 1000), sharePod("words", 1000)
	whole.Annotations = map[string]string{annNouseType: "NVIDIA A100"}  // no card is that model
	words.Annotations = map[string]string{annNouseType: "NVIDIA, A100"} // every card is NVIDIA
	if s := p.Filter(context.Background(), preFiltered(t, p, whole), whole, info); !s.IsSuccess() {
		t.Fatalf("Filter of a pod excluding NVIDIA A100 = %v", s)
	}
	if s := p.Filter(context.Background(), preFiltered(t, p, words), words, info); s.IsSuccess() {
		t.Fatal("a pod excluding NVIDIA cards passed the filter on a node of NVIDIA A10 cards")
	}
}

// Bugs caught: the scheduler running on its last good config while its metrics say nothing
// (alert EgpuConfigNotApplied silent), or a stale series left beside the new one.
func TestTheConfigInfoSaysWhichConfigRuns(t *testing.T) {
	dir := t.TempDir()
	file, keep := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "keep")
	good := "sharesPerCard: 4\n"
	if err := os.WriteFile(file, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	want := func(source string) string {
		return `
# HELP egpu_config_info [ALPHA] The config a part runs: its generation (SHA-256 prefix of the config text) and source (file, or last-good when the file is bad)
# TYPE egpu_config_info gauge
egpu_config_info{generation="` + config.Generation(good) + `",part="scheduler",source="` +
			source + `"} 1
`
	}
	if _, err := (Args{ConfigFile: file, ConfigKeepDir: keep}).load(); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(legacyregistry.DefaultGatherer,
		strings.NewReader(want("file")), "egpu_config_info"); err != nil {
		t.Error(err)
	}
	if err := os.WriteFile(file, []byte("sharesPerCard: lots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (Args{ConfigFile: file, ConfigKeepDir: keep}).load(); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(legacyregistry.DefaultGatherer,
		strings.NewReader(want("last-good")), "egpu_config_info"); err != nil {
		t.Error(err)
	}
}

// Bug caught: a pod nominated to the node by preemption (no record, no reservation: not bound
// yet) booking nothing, so a pod of lower priority takes the cards its victims freed and the
// preemptor preempts again.
func TestAPodNominatedToTheNodeHoldsTheCardsItFits(t *testing.T) {
	p := newPlugin(nil, defaultSettings())
	pod := sharePod("p", 16000)
	if s := p.Filter(context.Background(), preFiltered(t, p, pod), pod,
		nodeInfo(node("n1", 1))); !s.IsSuccess() {
		t.Fatalf("Filter on the empty card = %v", s)
	}
	preemptor := sharePod("preemptor", 16000) // as the scheduler adds it: no node name yet
	withNominated := nodeInfo(node("n1", 1), preemptor)
	if s := p.Filter(context.Background(), preFiltered(t, p, pod), pod,
		withNominated); s.Code() != fwk.Unschedulable {
		t.Fatalf("Filter beside the nominated preemptor = %v, want Unschedulable", s)
	}
	small := sharePod("small", 8000) // what the preemptor leaves fits
	if s := p.Filter(context.Background(), preFiltered(t, p, small), small,
		withNominated); !s.IsSuccess() {
		t.Fatalf("Filter of 8000 MiB beside the nominated preemptor = %v", s)
	}
}

// Bug caught: Score and Reserve fitting the pod on the node without the pods nominated there
// (the scheduler adds them for Filter only), so a pod that fits beside a preemptor, with a
// spread policy, reserves the empty card its victims freed and the preemptor preempts again.
func TestReserveChoosesCardsBesideAPodNominatedToTheNode(t *testing.T) {
	n := node("n1", 2)
	busy := recorded(sharePod("busy", 1), "n1", 0, 10000) // GPU-0: 14000 MiB free
	preemptor := sharePod("preemptor", 22000)             // fits GPU-1 only, once emptied
	high := int32(1000)
	preemptor.Spec.Priority = &high
	h := &fakeHandle{snapshot: schedcache.NewSnapshot([]*v1.Pod{busy}, []*v1.Node{n}),
		nominated: map[string][]fwk.PodInfo{"n1": {mustPodInfo(t, preemptor)}}}
	p := newPlugin(h, defaultSettings())
	pod := sharePod("spread", 12000) // fits either card; spread picks the emptier, GPU-1
	pod.Annotations = map[string]string{annGPUPolicy: "spread"}
	state := preFiltered(t, p, pod)
	info, _ := h.snapshot.NodeInfos().Get("n1")
	if score, s := p.Score(context.Background(), state, pod, info); !s.IsSuccess() || score < 1 {
		t.Fatalf("Score beside the nominated preemptor = %d, %v; want at least 1", score, s)
	}
	if s := p.Reserve(context.Background(), state, pod, "n1"); !s.IsSuccess() {
		t.Fatalf("Reserve: %v", s)
	}
	r, _ := p.reservation(pod.UID)
	if got := r.placement.Containers[0].Cards[0].UUID; got != "GPU-0" {
		t.Fatalf("reserved card %s, want GPU-0 (GPU-1 is the nominated preemptor's)", got)
	}
}

// Bugs caught: Score and Reserve counting nominated pods that Filter's first pass leaves out,
// a nominated pod of lower priority (withNominated's priority rule: the subtest fails without
// it) or the pod itself (nominated to the node by an earlier preemption; nodeState leaves it
// out as well), so that the pod is pushed off the card it fits best.
func TestReserveLeavesOutNominatedPodsOfLowerPriorityAndThePodItself(t *testing.T) {
	pod := sharePod("p", 12000) // binpack: the fuller card that fits, GPU-0 (14000 MiB free)
	low := sharePod("low", 14000)
	lower := int32(-1)
	low.Spec.Priority = &lower
	for name, nominated := range map[string]*v1.Pod{"lower priority": low, "itself": pod} {
		t.Run(name, func(t *testing.T) {
			n := node("n1", 2)
			busy := recorded(sharePod("busy", 1), "n1", 0, 10000)
			h := &fakeHandle{snapshot: schedcache.NewSnapshot([]*v1.Pod{busy}, []*v1.Node{n}),
				nominated: map[string][]fwk.PodInfo{"n1": {mustPodInfo(t, nominated)}}}
			p := newPlugin(h, defaultSettings())
			if s := p.Reserve(context.Background(), preFiltered(t, p, pod), pod,
				"n1"); !s.IsSuccess() {
				t.Fatalf("Reserve: %v", s)
			}
			r, _ := p.reservation(pod.UID)
			if got := r.placement.Containers[0].Cards[0].UUID; got != "GPU-0" {
				t.Fatalf("reserved card %s, want GPU-0 (the nominated pod does not count)", got)
			}
		})
	}
}

func mustPodInfo(t *testing.T, pod *v1.Pod) fwk.PodInfo {
	t.Helper()
	pi, err := framework.NewPodInfo(pod)
	if err != nil {
		t.Fatal(err)
	}
	return pi
}
