package plugin

import (
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/egpu/egpu/kube-scheduler/placement"
)

// fakeHandle is the scheduler's handle with the snapshot the tests give; any other method
// panics (nil embedded interface).
type fakeHandle struct {
	fwk.Handle
	snapshot  fwk.SharedLister
	client    kubernetes.Interface
	nominated map[string][]fwk.PodInfo // by node name, as the scheduler's nominator keeps them
}

func (h *fakeHandle) NominatedPodsForNode(node string) []fwk.PodInfo { return h.nominated[node] }

func (h *fakeHandle) ClientSet() kubernetes.Interface { return h.client }

func (h *fakeHandle) SnapshotSharedLister() fwk.SharedLister { return h.snapshot }
func (h *fakeHandle) GetWaitingPod(types.UID) fwk.WaitingPod { return nil }

func klogDiscard() klog.Logger { return klog.Background() }

// placementOn is one container "main" with mib MiB of card GPU-<card>.
func placementOn(card int, mib int64) *placement.Placement {
	uuid := "GPU-" + string(rune('0'+card))
	return &placement.Placement{Containers: []placement.ContainerAllocation{{Name: "main",
		Cards: []placement.CardShare{{UUID: uuid, Index: card, MemoryMiB: int(mib)}}}},
		Bookings: map[string]placement.CardBooking{uuid: {MemoryMiB: int(mib), Slots: 1}}}
}
